// The Hugging Face import plan (import_plan.h).
#include "formats/hf/import_plan.h"

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "core/error.h"
#include "formats/hf/config.h"
#include "patterns/name_template.h"

namespace ucpkit::formats::hf {

namespace {

const Family& family_of(const std::vector<Family>& families, const nlohmann::json& config, const std::string& where) {
  std::string arch;
  if (config.contains("architectures") && config["architectures"].is_array() && !config["architectures"].empty() &&
      config["architectures"][0].is_string())
    arch = config["architectures"][0].get<std::string>();
  std::string maps;
  for (const auto& f : families) {
    for (const auto& a : f.architectures)
      if (a == arch) return f;
    maps += (maps.empty() ? "" : ", ") + f.family + " (";
    for (size_t k = 0; k < f.architectures.size(); ++k) maps += (k ? ", " : "") + f.architectures[k];
    maps += ")";
  }
  throw Error(where + ": architectures " + (config.contains("architectures") ? config["architectures"].dump() : "missing") +
              " has no Hugging Face family map (patterns/hf); maps: " + maps);
}

int64_t need_int(const nlohmann::json& c, const char* key, const std::string& where) {
  if (!c.contains(key) || !c[key].is_number_integer()) throw Error(where + ": \"" + key + "\" is missing or not an integer");
  return c[key].get<int64_t>();
}

// The facts the family's map writes into config.json ("key": "$fact"), read back; two keys of one fact
// must agree (Llama's attention_bias and mlp_bias are Megatron's one add_bias_linear).
void facts_of_family_keys(const nlohmann::json& c, const Family& family, nlohmann::json& f, const std::string& where) {
  std::map<std::string, std::string> from;
  for (const auto& [key, v] : family.config.items()) {
    if (!v.is_string() || v.get<std::string>().rfind('$', 0) != 0 || !c.contains(key) || c[key].is_null()) continue;
    const std::string fact = v.get<std::string>().substr(1);
    if (from.count(fact) && f[fact] != c[key])
      throw Error(where + ": \"" + key + "\" is " + c[key].dump() + " but \"" + from[fact] + "\" is " + f[fact].dump() +
                  ": Megatron-Core has one setting for both");
    f[fact] = c[key];
    from[fact] = key;
  }
  for (const auto& [key, want] : family.requires_config.items())
    if (c.contains(key) && c[key] != want)
      throw Error(where + ": \"" + key + "\" is " + c[key].dump() + "; Megatron-Core computes the " + family.family +
                  " family with " + want.dump() + " only");
}

// The decoder layers without experts, ascending: as transformers' Qwen2-MoE / Qwen3-MoE decoder layers decide
// (modeling_qwen2_moe.py:358-359: an MoE block unless the layer is in mlp_only_layers or (layer + 1) %
// decoder_sparse_step != 0); none in a dense model.
nlohmann::json dense_layers_of(const nlohmann::json& c, const nlohmann::json& f, const std::string& where) {
  std::set<int64_t> dense;
  const int64_t layers = f["layers"].get<int64_t>();
  if (f["experts"].get<int64_t>() > 0) {
    const nlohmann::json listed = f.contains("dense_layers") ? f["dense_layers"] : nlohmann::json::array();
    if (!listed.is_array()) throw Error(where + ": \"mlp_only_layers\" is not a list of layer numbers");
    for (const auto& l : listed) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers)
        throw Error(where + ": \"mlp_only_layers\" holds " + l.dump() + ", not a layer number below " + std::to_string(layers));
      dense.insert(l.get<int64_t>());
    }
    if (c.contains("decoder_sparse_step") && !c["decoder_sparse_step"].is_null()) {
      if (!c["decoder_sparse_step"].is_number_integer() || c["decoder_sparse_step"].get<int64_t>() < 1)
        throw Error(where + ": \"decoder_sparse_step\" is " + c["decoder_sparse_step"].dump() + ", not a positive integer");
      const int64_t step = c["decoder_sparse_step"].get<int64_t>();
      for (int64_t l = 0; l < layers; ++l)
        if ((l + 1) % step != 0) dense.insert(l);
    }
  }
  return nlohmann::json(std::vector<int64_t>(dense.begin(), dense.end()));
}

}  // namespace

nlohmann::json facts_from_config(const nlohmann::json& c, const Family& family, const std::string& where) {
  nlohmann::json f;
  f["hidden"] = need_int(c, "hidden_size", where);
  f["ffn"] = need_int(c, "intermediate_size", where);
  f["layers"] = need_int(c, "num_hidden_layers", where);
  const int64_t heads = need_int(c, "num_attention_heads", where);
  f["heads"] = heads;
  f["kv_heads"] = c.contains("num_key_value_heads") && c["num_key_value_heads"].is_number_integer() ? c["num_key_value_heads"].get<int64_t>() : heads;
  f["head_dim"] = c.contains("head_dim") && c["head_dim"].is_number_integer() ? c["head_dim"].get<int64_t>() : f["hidden"].get<int64_t>() / heads;
  f["max_positions"] = need_int(c, "max_position_embeddings", where);
  f["vocab"] = need_int(c, "vocab_size", where);
  f["norm_eps"] = c.value("rms_norm_eps", 1e-6);
  const std::string act = c.value("hidden_act", std::string("silu"));
  if (act != "silu") throw Error(where + ": \"hidden_act\" is '" + escaped_brief(act, 30) + "': Megatron-Core's SwiGLU computes silu");
  nlohmann::json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"] : nlohmann::json::object();
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) rope.update(c["rope_scaling"]);  // transformers 4's keys
  f["rope_theta"] = rope.value("rope_theta", c.value("rope_theta", 10000.0));
  const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  f["rope_llama3_factor"] = 0.0;
  if (type == "llama3") {
    // Megatron-Core's Llama 3.1 scaling fixes the other constants (rotary_pos_embedding.py:92-120).
    if (rope.value("low_freq_factor", 1.0) != 1.0 || rope.value("high_freq_factor", 4.0) != 4.0 ||
        rope.value("original_max_position_embeddings", 8192) != 8192)
      throw Error(where + ": rope llama3 scaling with constants other than Megatron-Core's (low 1, high 4, original 8192)");
    f["rope_llama3_factor"] = rope.value("factor", 8.0);
  } else if (type != "default") {
    throw Error(where + ": rope type '" + escaped_brief(type, 30) + "': Megatron-Core computes default rotary or llama3 scaling only");
  }
  f["tied"] = c.value("tie_word_embeddings", false);
  f["linear_bias"] = c.value("attention_bias", false);
  f["experts"] = 0;
  facts_of_family_keys(c, family, f, where);
  if (!f.contains("qkv_bias") || !f["qkv_bias"].is_boolean())  // a family key (Qwen2-MoE's qkv_bias), else the family's
    f["qkv_bias"] = family.match.value("qkv_bias_only", false) || f["linear_bias"].get<bool>();
  f["dense_layers"] = dense_layers_of(c, f, where);
  f["qk_norm"] = family.match.value("qk_norm", false);
  if (f.contains("norm_topk")) f["moe_pre_softmax"] = !f["norm_topk"].get<bool>();
  for (const auto& [k, v] : family.match.items())
    if (!f.contains(k)) f[k] = v;  // what the family fixes (Mixtral: no shared expert, softmax over the top k)
  if (f.value("moe", false) != (f["experts"].get<int64_t>() > 0))
    throw Error(where + ": the " + family.family + " family " + (f.value("moe", false) ? "needs" : "has no") + " experts; config says " +
                f["experts"].dump());
  return f;
}

namespace {

// The Megatron-Core parameter `name` made of Hugging Face tensors `names` (one rule's pieces, all or none
// present), checked against the config's sizes.
ImportParam import_param(const Rule& r, const std::vector<std::string>& names, const std::string& name,
                         const ImportPlan& p, const std::map<std::string, TensorShape>& tensors, const std::string& dir) {
  const std::string where = dir + "/config.json";
  for (const auto& n : names)
    if (!tensors.count(n))
      throw Error(dir + ": tensor " + n + " is missing (its " + (r.split == Split::Qkv ? "QKV" : "gate/up") + " siblings are there)");
  auto shape_of = [&](const std::string& n) -> const std::vector<int64_t>& { return tensors.at(n).shape; };
  ImportParam ip;
  ip.name = name;
  ip.merge = r.split;
  ip.sources = names;
  ip.dtype = tensors.at(names[0]).dtype;
  ip.shape = shape_of(names[0]);
  int64_t rows = 0;
  for (const auto& n : names) {
    const auto& s = shape_of(n);
    if (s.empty() || std::vector<int64_t>(s.begin() + 1, s.end()) != std::vector<int64_t>(ip.shape.begin() + 1, ip.shape.end()))
      throw Error(dir + ": tensor " + n + "'s shape does not join its siblings'");
    rows += s[0];
  }
  ip.shape[0] = rows;
  if (r.split == Split::Qkv) {
    const auto q = shape_of(names[0])[0], k = shape_of(names[1])[0], v = shape_of(names[2])[0];
    if (q != p.heads * p.head_dim || k != p.kv_heads * p.head_dim || v != k)
      throw Error(where + ": " + names[0] + " / " + names[1] + " have " + std::to_string(q) + " / " + std::to_string(k) +
                  " rows; the config's heads, key-value heads and head_dim say " + std::to_string(p.heads * p.head_dim) +
                  " / " + std::to_string(p.kv_heads * p.head_dim));
  }
  const std::string ffn = ffn_fact(r);
  if (r.split == Split::GateUp && shape_of(names[0])[0] != p.facts[ffn].get<int64_t>())
    throw Error(where + ": " + names[0] + " has " + std::to_string(shape_of(names[0])[0]) + " rows, the config's " +
                (ffn == "moe_ffn" ? "expert " : ffn == "shared_ffn" ? "shared expert " : "") + "intermediate size says " +
                p.facts[ffn].dump());
  if (r.vocab && ip.shape[0] != p.facts["vocab"].get<int64_t>())
    throw Error(where + ": " + names[0] + " has " + std::to_string(ip.shape[0]) + " rows, vocab_size says " + p.facts["vocab"].dump());
  return ip;
}

// Expert rule `r`'s parameters of `layer` from the fused tensor `name` [E, ...]: each expert's element,
// whole (gate_up_proj[e] = [gate; up] is SwiGLU's fc1 as it is).
void add_fused_experts(const Rule& r, const std::string& name, long layer, long experts, ImportPlan& p,
                       const std::map<std::string, TensorShape>& tensors, const std::string& dir) {
  const auto& t = tensors.at(name);
  if (t.shape.size() < 2 || t.shape[0] != experts)
    throw Error(dir + ": tensor " + name + " has shape " + nlohmann::json(t.shape).dump() + ", not [" + std::to_string(experts) +
                " experts, ...] (config.json)");
  const char* ffn = r.split == Split::GateUp ? "moe_ffn" : nullptr;
  if (ffn && t.shape[1] != 2 * p.facts[ffn].get<int64_t>())
    throw Error(dir + "/config.json: " + name + " has " + std::to_string(t.shape[1]) + " rows per expert, the config's expert "
                "intermediate size says 2 x " + p.facts[ffn].dump());
  for (long e = 0; e < experts; ++e) {
    ImportParam ip;
    ip.name = filled(r.megatron_core.front(), layer, e);
    ip.sources = {name};
    ip.index = e;
    ip.dtype = t.dtype;
    ip.shape.assign(t.shape.begin() + 1, t.shape.end());
    p.params.push_back(std::move(ip));
  }
}

}  // namespace

ImportPlan plan_hf_import(const std::vector<Family>& families, const nlohmann::json& config,
                          const std::map<std::string, TensorShape>& tensors, const std::string& dir) {
  const std::string where = dir + "/config.json";
  const Family& fam = family_of(families, config, where);
  ImportPlan p;
  p.family = fam.family;
  p.origin = fam.origin;
  p.facts = facts_from_config(config, fam, where);
  p.heads = p.facts["heads"], p.kv_heads = p.facts["kv_heads"], p.head_dim = p.facts["head_dim"];
  const int64_t layers = p.facts["layers"];
  std::set<std::string> used;
  const int64_t experts = p.facts["experts"];
  for (const Rule& r : fam.rules) {
    const bool per_layer = r.megatron_core.front().find("{L}") != std::string::npos;
    const long expert_count = per_expert(r) ? experts : 0;
    for (long layer = per_layer ? 0 : -1; layer < (per_layer ? layers : 0); ++layer) {
      if (!rule_for_layer(r, p.facts, layer)) continue;  // a dense layer's MLP in an MoE layer, or the other way
      // The fused expert layout (Rule::fused: save_pretrained(save_original_format=False), or --hf-experts
      // fused): one tensor of the layer's experts, element e of its first axis expert e's parameter.
      if (expert_count && !r.fused.empty() && tensors.count(filled(r.fused, layer, -1))) {
        add_fused_experts(r, filled(r.fused, layer, -1), layer, expert_count, p, tensors, dir);
        used.insert(filled(r.fused, layer, -1));
        continue;
      }
      for (long expert = expert_count ? 0 : -1; expert < expert_count; ++expert) {
        std::vector<std::string> names;
        size_t present = 0;
        for (const auto& h : r.hf) names.push_back(filled(h, layer, expert)), present += tensors.count(names.back());
        if (present == 0 && !r.fused.empty() && expert < 0 && tensors.count(filled(r.fused, layer, -1)))
          names = {filled(r.fused, layer, -1)}, present = 1;  // the fused layout's name of the tensor (Mixtral's router)
        // A rule the map marks optional (biases: the tensors decide, as on export; the head, absent from a
        // tied model, checked below) may be absent; every other tensor of every layer must be there.
        if (present == 0 && !r.optional)
          throw Error(dir + ": tensor " + names[0] + " is missing (config.json says " + std::to_string(layers) + " layers" +
                      (expert >= 0 ? ", " + std::to_string(experts) + " experts" : std::string()) + ")");
        if (present == 0) continue;
        for (const auto& n : names) used.insert(n);
        p.params.push_back(import_param(r, names, filled(r.megatron_core.front(), layer, expert), p, tensors, dir));
      }
    }
  }
  for (const auto& [n, s] : tensors)
    if (!used.count(n))
      throw Error(dir + ": tensor " + n + " has no rule in Hugging Face family map " + fam.family + " (" + fam.origin +
                  "): it would be dropped");
  const bool has_head = std::any_of(p.params.begin(), p.params.end(), [](const ImportParam& x) { return x.name == "output_layer.weight"; });
  if (p.facts["tied"].get<bool>() == has_head)
    throw Error(where + ": tie_word_embeddings is " + p.facts["tied"].dump() + " but the folder " + (has_head ? "holds" : "lacks") +
                " lm_head.weight");
  const std::string d = config.value("dtype", config.value("torch_dtype", std::string()));
  p.dtype = d == "bfloat16" ? DType::BFloat16 : d == "float16" ? DType::Float16 : d == "float32" ? DType::Float32
          : p.params.empty() ? DType::Float32 : p.params.front().dtype;
  return p;
}

nlohmann::json ImportPlan::to_json() const {
  nlohmann::json j;
  j["family"] = family;
  j["map"] = origin;
  j["facts"] = facts;
  j["dtype"] = std::string(dtype_name(dtype));
  auto& ps = j["params"] = nlohmann::json::array();
  for (const auto& x : params) ps.push_back({{"name", x.name}, {"shape", x.shape}, {"from", x.sources}});
  return j;
}

nlohmann::json experts_per_layer(const std::vector<std::string>& megatron_core_names) {
  static const std::regex expert(R"(decoder\.layers\.(\d+)\..*\.experts\.experts\.(\d+)\..*)");
  std::map<long, std::set<long>> seen;
  std::smatch m;
  for (const auto& n : megatron_core_names)
    if (std::regex_match(n, m, expert)) seen[std::stol(m[1])].insert(std::stol(m[2]));
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [layer, ids] : seen) out[std::to_string(layer)] = ids.size();
  return out;
}

}  // namespace ucpkit::formats::hf
