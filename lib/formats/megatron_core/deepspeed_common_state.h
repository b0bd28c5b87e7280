// The Megatron-Core common state (docs/formats-megatron-core.md: megatron_core/common_state.pt of a
// Megatron-Core-named universal folder) made for a Megatron-DeepSpeed source, so that ucp-load --format
// torch_dist can write its Megatron-Core-named universal folder (issue 30 part B): Megatron-DeepSpeed's
// args (a fork of Megatron-LM's arguments.py, the same field names) with the Megatron-Core MoE fields
// (num_experts as one count, moe_layer_freq as Megatron-Core's per-layer list, expert_model_parallel_size),
// checkpoint_version 3.0, the iteration, and the optimizer's param_groups (without params, the step of
// the universal folder in each) in the place Megatron-Core's save keeps them.
#pragma once
#include <cstdint>
#include <string>

#include "io/pickle/value.h"

namespace ucpkit::formats::megatron_core {

// `model_states`: a Megatron-DeepSpeed mp_rank model-states root (args, iteration); `optimizer_state`:
// the universal zero/optimizer_state.pt root (param_groups); `step`: a per-parameter step.pt value (null:
// none). Throws Error naming `model_file` when it has no Megatron args.
pickle::ValuePtr common_state_from_deepspeed(const pickle::ValuePtr& model_states, const std::string& model_file,
                                             const pickle::ValuePtr& optimizer_state, const pickle::ValuePtr& step);

// Megatron's padded vocabulary size from a Megatron-DeepSpeed model-states root's args (the rows of a
// Megatron-Core word embedding / output layer at the source's TP); 0 when args does not say.
int64_t padded_vocab_size(const pickle::ValuePtr& model_states);

}  // namespace ucpkit::formats::megatron_core
