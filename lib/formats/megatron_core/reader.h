// Reads a Megatron-Core torch_dist checkpoint (an iteration folder, or a save root with
// latest_checkpointed_iteration.txt) into the typed key model: metadata.json, the common state,
// every DCP entry classified (formats/megatron_core/key_model), the model parameters per layer and
// per expert, the fully_reshardable optimizer state per parameter, and the dp_reshardable flat
// bucket tensors. Tensors go through formats/dcp/reader, one stored tensor at a time.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/dcp/range_reader.h"
#include "formats/dcp/reader.h"
#include "formats/megatron_core/common_state.h"
#include "formats/megatron_core/config.h"
#include "formats/megatron_core/key_model.h"
#include "io/tensor.h"

namespace ucpkit::formats::megatron_core {

enum class OptimizerFormat {
  None,              // no distributed-optimizer tensors (model only, or a non-distributed optimizer)
  DpReshardable,     // per-bucket flat tensors (Megatron's default)
  FullyReshardable,  // optimizer.state.<state>.<model key>, model space
};
std::string_view optimizer_format_name(OptimizerFormat f);

// One parameter of the model (one layer, one expert) and where it is stored.
struct ModelParam {
  ParamSlice slice;       // name, leading indices, shape
  std::string fqn;        // the stored model tensor
  const Key* key = nullptr;
};

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  // params() point into keys(): not copyable.
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  const std::string& dir() const { return dir_; }
  const CheckpointConfig& config() const { return config_; }
  const dcp::Reader& dcp() const { return *dcp_; }
  const CommonState& common() const { return common_; }
  OptimizerFormat optimizer_format() const { return optimizer_format_; }
  // Every DCP entry classified, in .metadata order.
  const std::vector<Key>& keys() const { return keys_; }

  // Every model parameter per layer and per expert, in .metadata order of their stored tensors. An MoE
  // layer's pre-MLP norm stored under both layer specs' keys (ucpkit's output for sources without a spec:
  // formats/megatron_core/writer.h, WriteLayout::both_norm_keys) is one parameter, the local spec's
  // mlp.linear_fc1.layer_norm_*; the constructor checks that the two hold the same values and states.
  const std::vector<ModelParam>& params() const { return params_; }
  // The parameter named `name` (decoder.layers.{L}.[...experts.{E}.]<param>); throws Error.
  const ModelParam& param(const std::string& name) const;
  // Its model value, or (state = param | exp_avg | exp_avg_sq) its fully_reshardable optimizer
  // state; throws Error naming .metadata when that state is not stored. Reads only the chunks of
  // that layer / expert when the stack is chunked per layer (formats/megatron_core/leading_slice).
  Tensor read_param(const ModelParam& p, const std::string& state = "") const;
  // The same value as element ranges read straight from the data files (formats/dcp/range_reader.h),
  // checked as read_param checks it; null where its chunks span several layers or experts.
  std::unique_ptr<dcp::RangeReader> range_param(const ModelParam& p, const std::string& state = "") const;

  // dp_reshardable: the bucket tensors (Key::bucket) and one of them read whole (its global size is
  // the bucket's numel_unpadded). Throws Error when `key` is not a bucket of this checkpoint.
  std::vector<const Key*> buckets() const;
  Tensor read_bucket(const Key& key) const;
  // The ShardedObject item `fqn` (e.g. optimizer.distributed.dp_group_idx_0.per_bucket_numel/shard_0_1)
  // unpickled: the object saved (items are torch.save([obj])). Throws Error naming the file.
  pickle::ValuePtr read_object(const std::string& fqn) const;

 private:
  void classify();
  void set_aside_norm_repeats();
  void check_norm_repeats() const;
  std::string state_fqn(const ModelParam& p, const std::string& state) const;  // read_param's tensor
  void check_optimizer_format();

  std::string dir_;
  CheckpointConfig config_;
  std::unique_ptr<dcp::Reader> dcp_;
  CommonState common_;
  OptimizerFormat optimizer_format_ = OptimizerFormat::None;
  std::vector<Key> keys_;
  std::vector<ModelParam> params_;
  std::vector<std::pair<ModelParam, size_t>> norm_repeats_;  // each pre_mlp_layernorm.* left out, the index it repeats
  std::unordered_map<std::string, size_t> param_index_;
};

}  // namespace ucpkit::formats::megatron_core
