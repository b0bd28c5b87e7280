// Which DCP fqn of a Megatron-Core torch_dist checkpoint is what (docs/formats-megatron-core.md):
//  * model ShardedTensors keyed by the module path: `embedding.word_embeddings.weight`,
//    `decoder.layers.<param>` with a prepended layer axis (homogeneous stacks) or
//    `decoder.layers.{L}.<param>` (non-homogeneous: MoE layer frequency lists, ...),
//    `decoder.final_layernorm.*`, `output_layer.weight`; experts under `.experts.` with an expert
//    axis (grouped and sequential experts alike) or `.experts.{E}.` (singleton_local_shards);
//  * fully_reshardable optimizer state `optimizer.state.{param,exp_avg,exp_avg_sq}.<model key>`;
//  * dp_reshardable per-bucket flat tensors
//    `[chained_{i}.]optimizer.distributed.dp_group_idx_{g}.gbuf_idx_{b}.dtype_{dtypes}.bucket_idx_{k}.<state>`;
//  * ShardedObjects (bytes items) `<key>/shard_<offsets>_<shape>`: common_state, `._extra_state`,
//    the distributed optimizer's `optimizer.distributed.dp_group_idx_{g}.{optimizer,per_bucket_numel,
//    per_bucket_numel_unpadded}`, rng_state, rerun_state_machine_state.
// Anything else is a key the model does not know: classify_key throws Error naming the file.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ucpkit::formats::megatron_core {

enum class KeyKind {
  Model,           // a model parameter ShardedTensor
  OptimizerState,  // fully_reshardable: optimizer.state.<state>.<model key> (model space)
  DpBucket,        // dp_reshardable: one flat bucket tensor of one state
  Object,          // a ShardedObject (bytes item)
};

// A model ShardedTensor key taken apart.
struct ModelKey {
  std::string key;                // the whole model key, e.g. decoder.layers.mlp.linear_fc1.weight
  bool layer_axis = false;        // decoder.layers.<param>: dim 0 is the global layer number
  std::optional<int64_t> layer;   // decoder.layers.{L}.<param>
  bool expert_axis = false;       // .experts.<param>: the next dim (after the layer axis) is the expert
  std::optional<int64_t> expert;  // .experts.{E}.<param> (singleton_local_shards)
  std::string head;               // before the layer part ("decoder.layers." or the whole key if none)
  std::string inner;              // the parameter inside its layer, experts part written "experts."
                                  // (e.g. "mlp.experts.linear_fc1.weight", "self_attention.linear_qkv.weight")
  size_t expert_at = 0;            // where the expert number goes in `inner` (after "experts.")
  // Leading axes the stored tensor has in front of the parameter (0, 1 or 2).
  size_t leading_axes() const { return (layer_axis ? 1 : 0) + (expert_axis ? 1 : 0); }
};

struct DpBucketKey {
  int64_t dp_group_idx = 0;
  int64_t gbuf_idx = 0;
  std::string dtypes;  // as written, e.g. "(torch.bfloat16, torch.float32)" (param dtype, grad dtype)
  int64_t bucket_idx = 0;
  std::string state;   // param, exp_avg, exp_avg_sq
};

struct Key {
  KeyKind kind = KeyKind::Model;
  std::string fqn;
  std::string state;   // OptimizerState: param | exp_avg | exp_avg_sq
  ModelKey model;      // Model and OptimizerState
  DpBucketKey bucket;  // DpBucket
  std::string object;  // Object: the ShardedObject key (before "/shard_")
  int64_t chain = -1;  // DpBucket / Object: i of a ChainedOptimizer's chained_{i}. prefix, else -1
};

// Takes apart the DCP fqn `fqn`; `is_bytes` says whether the entry is a bytes item. Throws Error
// "<file>: ... unknown key ..." for a key the model does not know.
Key classify_key(const std::string& fqn, bool is_bytes, const std::string& file);

// Takes apart a model key (Model, or the tail of an OptimizerState key); throws Error naming `file`.
ModelKey parse_model_key(const std::string& key, const std::string& file);

// One parameter of one layer (and one expert) inside a stored tensor.
struct ParamSlice {
  std::string name;             // decoder.layers.{L}.[...experts.{E}.]<param>, or the key itself
  std::vector<int64_t> index;   // indices into the stored tensor's leading axes (layer, expert)
  std::vector<int64_t> shape;   // the parameter's shape (stored shape without the leading axes)
};

// The per-layer / per-expert parameters a model key of stored shape `size` holds, layers then
// experts in order. Throws Error naming `file` when the shape lacks the leading axes.
std::vector<ParamSlice> param_slices(const ModelKey& key, const std::vector<int64_t>& size,
                                     const std::string& file);

// An MoE layer's pre-MLP norm under the other Megatron GPT layer spec's key (models/gpt/gpt_layer_specs.py,
// core_v0.19.0 / 0.16.1: the local spec stores it as decoder.layers.{L}.mlp.linear_fc1.layer_norm_<w> through its
// sharded_state_dict_keys_map, the Transformer Engine spec as the TENorm module decoder.layers.{L}.pre_mlp_layernorm.<w>),
// for a per-layer name of either form; "" for any other name. (A dense layer's norm is linear_fc1's in both specs:
// callers pair the two only in a layer with a router.)
std::string other_spec_norm_name(const std::string& name);
// Whether `name` is the Transformer Engine spec's form above (decoder.layers.{L}.pre_mlp_layernorm.<w>).
bool is_te_spec_norm_name(const std::string& name);

}  // namespace ucpkit::formats::megatron_core
