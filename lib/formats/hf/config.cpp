// config.json and the family choice (config.h). Keys as transformers 5.24.0 writes them for
// LlamaConfig / Qwen2Config / Qwen3Config / MixtralConfig / Qwen3MoeConfig (configuration_<family>.py;
// rope settings as rope_parameters, modeling_rope_utils.py); a family's own keys come from its map.
#include "formats/hf/config.h"

#include "core/error.h"

namespace ucpkit::formats::hf {

nlohmann::json with_derived_facts(nlohmann::json facts, const std::vector<std::string>& names) {
  auto any = [&](const char* suffix) {
    const std::string s = suffix;
    for (const auto& n : names)
      if (n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0) return true;
    return false;
  };
  if (!names.empty()) {
    facts["linear_bias"] = any(".linear_proj.bias") || any(".linear_fc2.bias");
    facts["qkv_bias"] = any(".linear_qkv.bias");
  }
  facts["qkv_bias_only"] = facts.value("qkv_bias", false) && !facts.value("linear_bias", false);
  facts["moe"] = facts.value("experts", int64_t{0}) > 0;
  // Facts of sources that predate them (an all-MoE model, no shared-expert gate).
  if (!facts.contains("dense_layers")) facts["dense_layers"] = nlohmann::json::array();
  if (!facts.contains("shared_gate")) facts["shared_gate"] = false;
  // Qwen3-MoE's norm_topk_prob (modeling_qwen3_moe.py:264-265) renormalises the top k of a softmax over
  // all experts: Megatron's default (softmax over the top k); without it, --moe-router-pre-softmax.
  facts["norm_topk"] = !facts.value("moe_pre_softmax", false);
  return facts;
}

namespace {

bool matches(const Family& f, const nlohmann::json& facts) {
  for (const auto& [k, v] : f.match.items())
    if (!facts.contains(k) || facts[k] != v) return false;
  return true;
}

}  // namespace

const Family& select_family(const std::vector<Family>& families, const nlohmann::json& facts, const std::string& where) {
  std::vector<const Family*> hits;
  std::string looked;
  for (const auto& f : families) {
    if (matches(f, facts)) hits.push_back(&f);
    looked += (looked.empty() ? "" : ", ") + f.family + " (" + f.origin + ")";
  }
  if (hits.size() == 1) return *hits.front();
  nlohmann::json deciding = nlohmann::json::object();
  for (const auto& f : families)
    for (const auto& [k, v] : f.match.items())
      if (facts.contains(k)) deciding[k] = facts[k];
  if (hits.empty())
    throw Error(where + ": no Hugging Face family map fits this model (" + deciding.dump() + "); maps: " + looked);
  std::string both;
  for (const auto* f : hits) both += (both.empty() ? "" : ", ") + f->family;
  throw Error(where + ": several Hugging Face family maps fit this model (" + both + "; " + deciding.dump() + ")");
}

nlohmann::ordered_json hf_config(const Family& family, const nlohmann::json& facts, int64_t vocab, DType dtype) {
  nlohmann::ordered_json c;
  c["architectures"] = family.architectures;
  c["model_type"] = family.model_type;
  c["hidden_size"] = facts.at("hidden");
  c["intermediate_size"] = facts.at("ffn");
  c["num_hidden_layers"] = facts.at("layers");
  c["num_attention_heads"] = facts.at("heads");
  c["num_key_value_heads"] = facts.at("kv_heads");
  c["head_dim"] = facts.at("head_dim");
  c["max_position_embeddings"] = facts.at("max_positions");
  c["vocab_size"] = vocab;
  c["rms_norm_eps"] = facts.at("norm_eps");
  nlohmann::ordered_json rope;
  rope["rope_theta"] = facts.at("rope_theta");
  if (const double factor = facts.value("rope_llama3_factor", 0.0); factor > 0) {
    // Megatron-Core's Llama 3.1 scaling (rotary_pos_embedding.py:92-120) has these constants fixed.
    rope["rope_type"] = "llama3";
    rope["factor"] = factor;
    rope["low_freq_factor"] = 1.0;
    rope["high_freq_factor"] = 4.0;
    rope["original_max_position_embeddings"] = 8192;
  } else {
    rope["rope_type"] = "default";
  }
  c["rope_parameters"] = rope;
  c["tie_word_embeddings"] = facts.at("tied");
  c["hidden_act"] = "silu";
  c["dtype"] = std::string(dtype == DType::BFloat16 ? "bfloat16" : dtype == DType::Float16 ? "float16" : "float32");
  for (const auto& [k, v] : family.config.items()) {
    if (v.is_string() && !v.get<std::string>().empty() && v.get<std::string>()[0] == '$') {
      const std::string fact = v.get<std::string>().substr(1);
      if (!facts.contains(fact)) throw Error(family.origin + ": config." + k + " names an unknown model fact '" + fact + "'");
      c[k] = facts[fact];
    } else {
      c[k] = v;
    }
  }
  return c;
}

}  // namespace ucpkit::formats::hf
