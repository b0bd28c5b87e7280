// What a Megatron-Core model is, from the args of its common state, in the terms other formats' model
// configurations need (the Hugging Face family and config.json: formats/hf/config.h): sizes, attention
// form, biases, norms, rotary embedding, tying, MoE. Refuses, naming the arg, a model whose math no
// such configuration states (learned positions, LayerNorm, a GELU MLP, partial or interleaved rotary,
// zero-centred norm weights). Pure.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "io/dtype.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::megatron_core {

// {"hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "max_positions", "norm_eps", "rope_theta",
//  "rope_llama3_factor" (0: no scaling), "tied", "linear_bias" (every linear layer), "qkv_bias" (QKV only),
//  "qk_norm", "experts" (0: dense), "moe_ffn", "moe_topk", "shared_ffn" (0: no shared expert), "shared_gate"
//  (the shared expert's sigmoid gate), "dense_layers" (the decoder layers without experts, ascending)}.
// Throws Error naming `file` and the arg.
nlohmann::json model_facts(const pickle::ValuePtr& common, const std::string& file);

// The Megatron args (an argparse.Namespace, Megatron-Core's names) of a model with `facts` (as above,
// plus "vocab": the vocabulary rows) trained in `dtype`, at TP = PP = EP = DP = 1: what a Megatron-Core
// common state made for a model that never ran under Megatron (a Hugging Face import) records. The
// inverse of model_facts.
pickle::ValuePtr megatron_args(const nlohmann::json& facts, DType dtype);

// The Megatron-Core common state (formats/megatron_core/deepspeed_common_state.h's form) of such a model
// at iteration 0: megatron_args, the optimizer's `optimizer_state` ({"param_groups": [...]}) with `step`
// in each group. `where` names the source in errors.
pickle::ValuePtr fresh_common_state(const nlohmann::json& facts, DType dtype, const pickle::ValuePtr& optimizer_state,
                                    const pickle::ValuePtr& step, const std::string& where);

}  // namespace ucpkit::formats::megatron_core
