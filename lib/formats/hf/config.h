// The Hugging Face side of a model: which family map (family_map.h) a model's facts
// (formats/megatron_core/model_facts.h) select, and the config.json transformers' from_pretrained
// reads (the keys transformers 5's save_pretrained writes for the family). Pure.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/hf/family_map.h"
#include "io/dtype.h"

namespace ucpkit::formats::hf {

// The facts with what the tensors say over what the args say: the biases ("linear_bias", "qkv_bias")
// from the Megatron-Core parameter names `names` (the args of a Megatron-DeepSpeed source may not record
// --disable-bias-linear), "qkv_bias_only" (QKV biases without the other linear biases), "moe" (experts
// > 0) and "norm_topk" (the router renormalises its top k: not --moe-router-pre-softmax) for matching.
nlohmann::json with_derived_facts(nlohmann::json facts, const std::vector<std::string>& names);

// The one family whose "match" facts all hold. Throws Error naming `where`, the facts that decide and
// the maps looked at, when none or several match.
const Family& select_family(const std::vector<Family>& families, const nlohmann::json& facts, const std::string& where);

// config.json: architectures, model_type, sizes, heads and KV heads, head_dim, vocab_size = `vocab`,
// rms_norm_eps, rope_parameters, tie_word_embeddings, hidden_act, dtype, then the family's own keys.
nlohmann::ordered_json hf_config(const Family& family, const nlohmann::json& facts, int64_t vocab, DType dtype);

}  // namespace ucpkit::formats::hf
