// ucp-union --input <Megatron-Core torch_dist folder or save root>: the checkpoint into ucpkit's
// universal form with Megatron-Core names, one parameter per layer and per expert
// (docs/formats-megatron-core.md, "Universal names"), read through formats/megatron_core's reader:
//  * fully_reshardable: each parameter's optimizer.state.{param,exp_avg,exp_avg_sq} slice of its layer
//    / expert (model space) is its fp32 / exp_avg / exp_avg_sq state file;
//  * dp_reshardable: the flat buckets unflattened through formats/megatron_core/dp_bucket_layout: each
//    TP-local piece read from only the bucket chunks holding its range, the pieces joined along the TP
//    split dimension (the two halves of a SwiGLU fc1 at their [W_all; V_all] rows);
//  * no distributed-optimizer state: the model tensor in fp32;
//  * step.pt: the param group's "step" (Megatron's saved param_groups carry it for torch Adam);
//  * zero/optimizer_state.pt {"param_groups": [...]}; megatron_core/common_state.pt: the common state
//    in its fully_reshardable form (formats/megatron_core/common_edit) (what ucp-load --format torch_dist writes back, args rewritten);
//    megatron_core/objects.pt: the `._extra_state` ShardedObjects' stored bytes.
// One parameter in memory at a time; committed as every union is (parallel::CollectiveStaging).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/universal/manifest.h"
#include "io/dtype.h"
#include "io/tensor.h"
#include "io/pickle/value.h"
#include "to_universal/convert.h"
#include "to_universal/from_dcp.h"

namespace ucpkit::formats::dcp {
class RangeReader;
}
namespace ucpkit::formats::megatron_core {
class Checkpoint;
}

namespace ucpkit::to_universal {

// The side files a Megatron-Core-named universal folder carries (relative to the folder).
inline constexpr const char* kMcoreCommonStateFile = "megatron_core/common_state.pt";
inline constexpr const char* kMcoreObjectsFile = "megatron_core/objects.pt";

struct TorchDistParam {
  std::string name;             // decoder.layers.{L}.<param>, ...experts.experts.{E}.<param>, or the key
  size_t model_param = 0;       // index into Checkpoint::params()
  std::vector<int64_t> shape;   // global
  DType dtype = DType::BFloat16;  // of the model tensor
  uint64_t bytes = 0;           // fp32 bytes of its states (the split over MPI ranks)
};

struct TorchDistPlan {
  std::vector<TorchDistParam> params;  // Checkpoint::params() order
  std::string optimizer_format;        // none | dp_reshardable | fully_reshardable
  formats::universal::UniversalSource source;  // manifest.json "source"
};

// The plan of an opened checkpoint. Throws Error naming the file when a parameter is in no bucket
// layout (dp_reshardable).
TorchDistPlan plan_torch_dist(const formats::megatron_core::Checkpoint& ck);

// The plan as ucp-union --dry-run counts it (from_dcp's DcpPlan: states per parameter, step); for a
// dp_reshardable save the bucket layouts are recomputed and checked as the union checks them (Error
// naming the file for a save the union refuses: ucp-info's plan check agrees with the union).
DcpPlan dcp_plan_of_torch_dist(const std::string& input);

// A torch_dist checkpoint read as universal fp32 states, one whole parameter state at a time (what
// ucp-union writes into each state file; ucp-load's one-pass torch_dist source reads through it too).
class TorchDistStates {
 public:
  // Opens and plans `input`; throws Error naming the file (a parameter in no bucket layout, ...).
  explicit TorchDistStates(const std::string& input);
  ~TorchDistStates();
  const formats::megatron_core::Checkpoint& checkpoint() const { return *ck_; }
  const TorchDistPlan& plan() const { return plan_; }
  bool has_optimizer() const;
  // The universal state names stored per parameter: fp32, exp_avg, exp_avg_sq (or fp32 alone).
  std::vector<std::string> states() const;
  // State `state` (a universal name) of plan().params[param] in fp32, the parameter's shape; thread-safe.
  Tensor read(size_t param, const std::string& state) const;
  // The same state as element ranges read straight from the data files, for a reader that hands every
  // element out once (ucp-load's one pass): null where read() must assemble it (dp_reshardable buckets,
  // a value stored in another dtype than fp32, chunks spanning several layers). Checked as read() is.
  std::unique_ptr<formats::dcp::RangeReader> range(size_t param, const std::string& state) const;
  // The common state in its fully_reshardable form, the saved param groups and their step (or null).
  const pickle::ValuePtr& common() const { return common_; }
  const std::vector<pickle::ValuePtr>& groups() const { return groups_; }
  const pickle::ValuePtr& step() const { return step_; }

 private:
  struct Pieces;
  std::unique_ptr<formats::megatron_core::Checkpoint> ck_;
  TorchDistPlan plan_;
  std::unique_ptr<Pieces> pieces_;
  pickle::ValuePtr common_, step_;
  std::vector<pickle::ValuePtr> groups_;
};

// The manifest entry of plan parameter `p` (state files named zero/<folder>/<state>.pt, no checksums).
formats::universal::UniversalParam torch_dist_entry(const TorchDistParam& p, const std::vector<std::string>& states,
                                                    bool step);

// The save's ._extra_state ShardedObjects as stored ({fqn: torch.save([obj]) bytes}), what megatron_core/objects.pt holds.
pickle::ValuePtr stored_extra_state_objects(const formats::megatron_core::Checkpoint& ck);
// The manifest ucp-union writes for the save, without checksums: parameters in plan order, the source, no patterns.
formats::universal::UniversalManifest torch_dist_manifest(const TorchDistStates& td);

// ucp-union for a torch_dist folder (from_dcp's run_union_dcp calls it for FolderKind::TorchDist).
RunSummary run_union_torch_dist(const std::string& input, const std::string& output, const ConvertOptions& options);

}  // namespace ucpkit::to_universal
