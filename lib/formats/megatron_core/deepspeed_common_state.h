// The Megatron-Core common state (docs/formats-megatron-core.md: megatron_core/common_state.pt of a
// Megatron-Core-named universal folder) made for a Megatron-DeepSpeed source, so that ucp-load --format
// torch_dist can write its Megatron-Core-named universal folder: Megatron-DeepSpeed's
// args (a fork of Megatron-LM's arguments.py, the same field names) with the Megatron-Core MoE fields
// (num_experts as one count, moe_layer_freq as Megatron-Core's per-layer list, expert_model_parallel_size),
// checkpoint_version 3.0, the iteration, and the optimizer's param_groups (without params, the step of
// the universal folder in each) in the place Megatron-Core's save keeps them; plus what Megatron-Core's
// load_checkpoint reads or checks (docs/megatron-core-mapping.md "Megatron-Core's load_checkpoint"):
// num_query_groups / group_query_attention / kv_channels / normalization / position_embedding_type in
// Megatron-Core's terms where the source's args say them, use_distributed_optimizer, ckpt_format,
// wd_mult / lr_mult / is_expert_parallel per group, param_state_sharding_type, opt_param_scheduler,
// num_floating_point_operations_so_far and the content_metadata of a fully_reshardable save.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/deepspeed/megatron_gpt.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::megatron_core {

// The other way: Megatron-DeepSpeed's args (its own names, megatron/arguments.py:619-681 and 937-939 at
// deepspeedai/Megatron-DeepSpeed 4efb479) of GPT `m` at TP = PP = DP = EP = 1 before its first step, `padded`
// vocabulary rows: what a fresh run's model file holds (formats/deepspeed/megatron_gpt.h). Read back by
// common_state_from_deepspeed, they give the same model facts.
pickle::ValuePtr megatron_deepspeed_args(const deepspeed::MegatronGpt& m, int64_t padded);

// `model_states`: a Megatron-DeepSpeed mp_rank model-states root (args, iteration); `optimizer_state`:
// the universal zero/optimizer_state.pt root (param_groups); `step`: a per-parameter step.pt value (null:
// none). Throws Error naming `model_file` when it has no Megatron args.
pickle::ValuePtr common_state_from_deepspeed(const pickle::ValuePtr& model_states, const std::string& model_file,
                                             const pickle::ValuePtr& optimizer_state, const pickle::ValuePtr& step);

// The ._extra_state ShardedObject keys Megatron-Core's local-spec model asks for on load (one per linear
// module and layer, stacked: decoder.layers.<module>._extra_state/shard_<L>_<layers>; key and offsets
// from megatron/core/transformer/utils.py:200-230 make_sharded_object_for_checkpoint with the layer
// offset prepended by the TransformerBlock; no TP axis) for the universal names `param_names`
// (decoder.layers.<L>.<module>.linear_*.weight|bias). `stacked`: the args' layer stack is homogeneous
// (args_facts().homogeneous; a dense model's always is): experts then shard_<l>.<e>_<L>.<E>. Otherwise,
// with experts (mixed dense / MoE layers, whose Megatron-Core keys are per layer)
// decoder.layers.<L>.<module>._extra_state/shard_0_1 and, per expert module,
// decoder.layers.<L>.mlp.experts.experts.linear_<x>._extra_state/shard_<e>_<E>.
std::vector<std::string> extra_state_keys(const std::vector<std::string>& param_names, bool stacked);

// {key: torch.save([None]) bytes} for extra_state_keys(param_names, stacked): get_extra_state of Megatron-Core's
// local linears returns None (tensor_parallel/layers.py:1229-1233, 1508-1512). A scratch file is made and
// removed in `scratch_dir`. Written as megatron_core/objects.pt, read by ucp-load --format torch_dist.
pickle::ValuePtr extra_state_objects(const std::vector<std::string>& param_names, bool stacked, const std::string& scratch_dir);

// Megatron's padded vocabulary size from a Megatron-DeepSpeed model-states root's args (the rows of a
// Megatron-Core word embedding / output layer at the source's TP); 0 when args does not say.
int64_t padded_vocab_size(const pickle::ValuePtr& model_states);

}  // namespace ucpkit::formats::megatron_core
