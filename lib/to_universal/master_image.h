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
#include "io/torch/verify.h"
#include "to_universal/plan.h"

namespace ucpkit::to_universal {

class MasterImage {
 public:
  // Indexes the module weights of the plan's mp_rank_XX_model_states.pt files, or for a PipelineModule
  // source of its layer_XX-model_TT-model_states.pt files (a tied module in each layer file that holds
  // it), read lazily: the tensors stay mapped. Empty (check() does nothing) for ZeRO-3, whose model
  // files hold no weights, and under --no-verify.
  // `verify`: false (--no-verify) leaves it empty. `open`: how the model files are opened (their CRC check).
  MasterImage(const ExtractPlan& plan, bool verify, const TorchLoadOptions& open = {});
  explicit MasterImage(const ExtractPlan& plan) : MasterImage(plan, verify_files_crc()) {}
  // `fp32`: parameter p's fp32 master, TP slices back to back starting at `offsets` (bytes). Each
  // slice rounded to its model file's dtype must equal the module weight of that TP rank. Throws
  // Error naming the model file and the shard holding the first element that differs. Thread-safe.
  void check(const ParamPlan& p, std::span<const uint8_t> fp32, const std::vector<size_t>& offsets,
             const std::vector<std::string>& files) const;
  // The same check for a run of TP slice `t`'s fp32 master read in pieces (ucp-load's direct mode):
  // `fp32` holds `n` elements starting at element `pos` of the slice. Thread-safe.
  void check_run(const ParamPlan& p, size_t t, int64_t pos, const float* fp32, int64_t n,
                 const std::vector<std::string>& files) const;
  bool empty() const { return weights_.empty(); }

 private:
  struct Copy {
    std::string path;
    Tensor weight;
  };
  using TpCopies = std::vector<Copy>;  // one copy per TP rank, in TP order
  // Elements [pos, pos + n) of `copy` against `fp32`; throws naming the files on the first difference.
  // `checked`: a copy of the same slice already compared (a tied module's other file), or null.
  void compare(const ParamPlan& p, size_t t, int64_t pos, const float* fp32, int64_t n, const Copy& copy,
               const Copy* checked, const std::vector<std::string>& files) const;
  // `only_compared`: the file is opened for the comparison alone (a layer file), without the CRC pass.
  void index_file(const std::string& path, const std::map<std::string, std::string>& names, size_t tp_rank,
                  bool only_compared = false);
  TorchLoadOptions open_;
  std::vector<TorchFile> files_;                       // keeps the mappings alive
  std::map<std::string, std::vector<TpCopies>> weights_;  // name -> its copies (a tied module: one per file)
};

}  // namespace ucpkit::to_universal
