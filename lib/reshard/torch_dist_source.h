// ucp-load --input <Megatron-Core torch_dist> --template <Megatron-DeepSpeed universal folder>
// --format deepspeed in one pass: the torch_dist save as a "virtual universal checkpoint" in
// Megatron-DeepSpeed names, as DirectSource makes one of a native DeepSpeed checkpoint. The manifest is
// what ucp-union --to-names megatron-deepspeed --template would write (to_universal::megatron_deepspeed_view:
// names, patterns, model files and DeepSpeed's optimizer state from the template); every value comes from
// the torch_dist save (to_universal::TorchDistStates: fully_reshardable slices, dp_reshardable buckets
// unflattened), its QKV rows regrouped and Megatron's padded vocabulary rows cut
// (to_universal::to_deepspeed_value). Nothing is written but the target; no universal folder, no scratch.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/dcp/range_reader.h"
#include "formats/detect.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"
#include "to_universal/direct.h"

namespace ucpkit::reshard {

struct TorchDistInput {
  std::string input;  // the torch_dist folder as given
  std::unique_ptr<to_universal::TorchDistStates> states;
  to_universal::DeepSpeedView view;
};

// Opens the torch_dist save and plans its Megatron-DeepSpeed view from `template_dir` (`map_file`:
// --model-map for a template in Megatron-DeepSpeed names; "" the shipped maps). Throws Error naming the
// file and what is missing.
std::shared_ptr<TorchDistInput> open_torch_dist_input(const std::string& input, const std::string& template_dir,
                                                      const std::string& map_file);

// The input kinds ucp-load reads in one pass through --template's Megatron-DeepSpeed view
// (registered by folder kind from the reader's own file, as direct mode's readers are; load.cpp and
// ucp-load's tool layer ask this table, never a format's name). Registered: torch_dist
// (open_torch_dist_input).
using TemplateReader = std::function<std::shared_ptr<const TorchDistInput>(
    const std::string& input, const std::string& template_dir, const std::string& map_file)>;
// Returns true (for a namespace-scope initializer).
bool register_template_reader(std::string_view kind, TemplateReader open);
// The reader registered for `kind`; empty when --template does not apply to that kind.
TemplateReader template_reader(const formats::FolderKind& kind);
// Whether ucp-load reads a folder of this kind through --template.
bool takes_template_input(const formats::FolderKind& kind);

// The manifest ucp-load reads, in memory (model files and optimizer state: the template's).
UniversalMeta torch_dist_meta(const TorchDistInput& in);

// Atomic tensors from the torch_dist save. Exchange mode asks for each atomic element once (an element
// asked twice is an Error). A state stored in fp32 in chunks of whole layers (fully_reshardable, the
// usual case) is not assembled: each range asked is read straight from the save's data files
// (formats/dcp/range_reader.h, pread) through its rows in Megatron-DeepSpeed layout (QKV regrouped,
// padded vocabulary rows cut: to_universal::deepspeed_value_rows), so memory holds no state at all; its
// items' CRC-32s are checked once every element has been handed out. Any other state (dp_reshardable
// buckets, another dtype) is read whole at its first request (in fp32, in Megatron-DeepSpeed layout) and
// dropped once every element has been handed out; while such states in flight hold more than
// kLiveBudget, the pages of each range handed out are released at once (madvise).
class TorchDistSource final : public AtomicSource {
 public:
  TorchDistSource(const TorchDistInput& in, const ModelInfo& model);
  void read(int param, int state, int64_t a, int64_t n, float* dst) override;
  pickle::ValuePtr step(int param) override;
  void whole_crc(int, int, uint32_t) override {}  // no checksums to compare: the torch_dist items carry their own
  bool wants_crc() const override { return false; }

 private:
  struct Slot {
    std::mutex mu;
    // While elements are still to be handed out: the state's element ranges read straight from the
    // save (`range`, its rows as runs of the stored value's rows), or where that reader does not apply
    // the state read whole (`value`).
    std::shared_ptr<formats::dcp::RangeReader> range;
    std::vector<formats::megatron_core::RowRun> rows;
    int64_t row_elems = 1;
    std::shared_ptr<const Tensor> value;
    int64_t served = 0;
    std::vector<std::pair<int64_t, int64_t>> given;  // element intervals handed out, sorted
  };
  static void copy_rows(const Slot& slot, formats::dcp::RangeReader& range, int64_t a, int64_t n, float* dst);
  static constexpr int64_t kLiveBudget = 64ll << 20;  // bytes of states in flight before pages are released
  std::atomic<int64_t> live_bytes_{0};
  const TorchDistInput& in_;
  const ModelInfo& model_;
  std::vector<size_t> view_index_;  // [ModelInfo param] -> index in in_.view.manifest.params
  std::vector<std::vector<std::unique_ptr<Slot>>> slots_;  // [param][state]
};

}  // namespace ucpkit::reshard
