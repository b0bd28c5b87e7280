// What a Megatron-Core model is, from the args of its common state, in the terms other formats' model
// configurations need (the Hugging Face family and config.json: formats/hf/config.h): sizes, attention
// form, biases, norms, rotary embedding, tying, MoE. Refuses, naming the arg, a model whose math no
// such configuration states (learned positions, LayerNorm, a GELU MLP, partial or interleaved rotary,
// zero-centred norm weights). Pure.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"

namespace ucpkit::formats::megatron_core {

// {"hidden", "ffn", "layers", "heads", "kv_heads", "head_dim", "max_positions", "norm_eps", "rope_theta",
//  "rope_llama3_factor" (0: no scaling), "tied", "linear_bias" (every linear layer), "qkv_bias" (QKV only),
//  "qk_norm", "experts" (0: dense), "moe_ffn", "moe_topk", "shared_ffn", "moe_layer_freq"}.
// Throws Error naming `file` and the arg.
nlohmann::json model_facts(const pickle::ValuePtr& common, const std::string& file);

}  // namespace ucpkit::formats::megatron_core
