// The module weights of a ZeRO-1/2 or BF16_Optimizer checkpoint are the low-precision image of its
// fp32 master partitions: after every step DeepSpeed copies each fp32 partition into the bit16
// partition (round to nearest even) that the module's parameters view, and saves those parameters in
// mp_rank_XX_model_states.pt. A model file or an optimizer shard of another run saved at the same step
// with the same configuration passes every identity check (shard_agreement.h) but breaks this image.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/tensor.h"
#include "io/torch/torch_file.h"
#include "to_universal/plan.h"

namespace ucpkit::to_universal {

class MasterImage {
 public:
  // Indexes the module weights of the plan's mp_rank_XX_model_states.pt files (read lazily: the
  // tensors stay mapped). Empty (check() does nothing) for ZeRO-3, whose model files hold no weights,
  // for pipeline checkpoints, whose weights live in layer files, and under --no-verify.
  explicit MasterImage(const ExtractPlan& plan);
  // `fp32`: parameter p's fp32 master, TP slices back to back starting at `offsets` (bytes). Each
  // slice rounded to its model file's dtype must equal the module weight of that TP rank. Throws
  // Error naming the model file and the shard holding the first element that differs. Thread-safe.
  void check(const ParamPlan& p, std::span<const uint8_t> fp32, const std::vector<size_t>& offsets,
             const std::vector<std::string>& files) const;
  bool empty() const { return weights_.empty(); }

 private:
  struct Copy {
    std::string path;
    Tensor weight;
  };
  std::vector<TorchFile> files_;                      // keeps the mappings alive
  std::map<std::string, std::vector<Copy>> weights_;  // name -> one copy per TP rank, in TP order
};

}  // namespace ucpkit::to_universal
