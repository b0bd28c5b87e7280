// Hugging Face family maps (family_map.h): parsing and name matching.
#include "formats/hf/family_map.h"

#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"
#include "patterns/name_template.h"

namespace ucpkit::formats::hf {

namespace {

std::vector<std::string> strings_of(const nlohmann::json& v, const std::string& origin, const std::string& where) {
  std::vector<std::string> out;
  if (v.is_string()) return {v.get<std::string>()};
  if (!v.is_array() || v.empty()) throw Error(origin + ": " + where + " must be a string or a non-empty list of strings");
  for (const auto& s : v) {
    if (!s.is_string()) throw Error(origin + ": " + where + " must hold strings");
    out.push_back(s.get<std::string>());
  }
  return out;
}

Split split_of(const std::string& s, const std::string& origin, const std::string& where) {
  if (s == "none") return Split::None;
  if (s == "qkv") return Split::Qkv;
  if (s == "gate_up") return Split::GateUp;
  throw Error(origin + ": " + where + ".split: '" + escaped_brief(s, 40) + "' is not one of none, qkv, gate_up");
}

size_t pieces_of(Split s) { return s == Split::Qkv ? 3 : s == Split::GateUp ? 2 : 1; }

}  // namespace

Family Family::from_json(const nlohmann::json& j, const std::string& origin) {
  Family f;
  f.origin = origin;
  if (!j.is_object() || j.value("format", std::string()) != kHfMapFormat)
    throw Error(origin + ": not a Hugging Face family map (\"format\": \"" + std::string(kHfMapFormat) + "\" expected)");
  for (const char* k : {"family", "model_type"})
    if (!j.contains(k) || !j[k].is_string()) throw Error(origin + ": \"" + k + "\" must be a string");
  f.family = j["family"].get<std::string>();
  f.model_type = j["model_type"].get<std::string>();
  f.architectures = strings_of(j.value("architectures", nlohmann::json()), origin, "\"architectures\"");
  if (j.contains("match")) {
    if (!j["match"].is_object()) throw Error(origin + ": \"match\" must be an object of model facts");
    f.match = j["match"];
  }
  if (j.contains("config")) {
    if (!j["config"].is_object()) throw Error(origin + ": \"config\" must be an object");
    f.config = nlohmann::ordered_json::parse(j["config"].dump());
  }
  if (j.contains("requires")) {
    if (!j["requires"].is_object()) throw Error(origin + ": \"requires\" must be an object of config.json keys and values");
    f.requires_config = j["requires"];
  }
  if (j.contains("module_order")) f.module_order = strings_of(j["module_order"], origin, "\"module_order\"");
  if (!j.contains("params") || !j["params"].is_array() || j["params"].empty())
    throw Error(origin + ": \"params\" must be a non-empty list of rules");
  for (size_t i = 0; i < j["params"].size(); ++i) {
    const auto& r = j["params"][i];
    const std::string where = "params[" + std::to_string(i) + "]";
    if (!r.is_object()) throw Error(origin + ": " + where + " must be an object");
    Rule rule;
    rule.megatron_core = strings_of(r.value("megatron_core", nlohmann::json()), origin, where + ".megatron_core");
    rule.hf = strings_of(r.value("hf", nlohmann::json()), origin, where + ".hf");
    rule.split = split_of(r.value("split", std::string("none")), origin, where);
    rule.vocab = r.value("vocab", false);
    rule.optional = r.value("optional", false);
    rule.fused = r.value("fused", std::string());
    const std::string layers = r.value("layers", std::string("all"));
    if (layers == "all") rule.layers = Layers::All;
    else if (layers == "moe") rule.layers = Layers::Moe;
    else if (layers == "dense") rule.layers = Layers::Dense;
    else throw Error(origin + ": " + where + ".layers: '" + escaped_brief(layers, 40) + "' is not one of all, moe, dense");
    rule.ffn = r.value("ffn", std::string());
    if (!rule.ffn.empty() && rule.split != Split::GateUp) throw Error(origin + ": " + where + ".ffn: only a gate_up split has one");
    if (!rule.fused.empty() && (rule.fused.find("{E}") != std::string::npos || (!per_expert(rule) && rule.split != Split::None)))
      throw Error(origin + ": " + where + ".fused: one tensor for all experts (no {E}), and only an expert rule may be split");
    if (rule.hf.size() != pieces_of(rule.split))
      throw Error(origin + ": " + where + ".hf names " + std::to_string(rule.hf.size()) + " tensors; its split makes " +
                  std::to_string(pieces_of(rule.split)));
    for (const auto& t : rule.megatron_core)
      for (size_t p = 0; (p = t.find('{', p)) != std::string::npos; ++p)
        if (t.compare(p, 3, "{L}") != 0 && t.compare(p, 3, "{E}") != 0)
          throw Error(origin + ": " + where + ".megatron_core: only {L} and {E} are placeholders");
    // An expert rule names the expert on both sides (a Hugging Face name without {E} would be written once
    // per expert).
    for (const auto& t : rule.hf)
      if ((t.find("{E}") != std::string::npos) != per_expert(rule))
        throw Error(origin + ": " + where + ": {E} must be in every name of an expert rule and in none of another");
    f.rules.push_back(std::move(rule));
  }
  return f;
}

Family read_hf_family(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open (Hugging Face family map)");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not JSON (" + e.what() + ")");
  }
  return Family::from_json(j, path);
}

std::vector<Family> shipped_hf_families() {
  std::vector<Family> out;
  for (const auto& [name, text] : shipped_hf_map_texts())
    out.push_back(Family::from_json(nlohmann::json::parse(text), "shipped:" + name));
  return out;
}

bool per_expert(const Rule& r) { return r.megatron_core.front().find("{E}") != std::string::npos; }

bool moe_layer(const nlohmann::json& facts, long layer) {
  if (facts.value("experts", int64_t{0}) <= 0) return false;
  if (!facts.contains("dense_layers") || !facts["dense_layers"].is_array()) return true;
  for (const auto& d : facts["dense_layers"])
    if (d.is_number_integer() && d.get<long>() == layer) return false;
  return true;
}

bool rule_for_layer(const Rule& r, const nlohmann::json& facts, long layer) {
  if (r.layers == Layers::All || layer < 0) return true;
  return (r.layers == Layers::Moe) == moe_layer(facts, layer);
}

std::string ffn_fact(const Rule& r) { return !r.ffn.empty() ? r.ffn : per_expert(r) ? "moe_ffn" : "ffn"; }

std::string filled(const std::string& t, long layer, long expert) {
  std::string s = layer >= 0 ? patterns::substitute_placeholder(t, "{L}", layer) : t;
  return expert >= 0 ? patterns::substitute_placeholder(s, "{E}", expert) : s;
}

std::optional<Matched> match_rule(const Family& family, const std::string& name) {
  for (size_t i = 0; i < family.rules.size(); ++i)
    for (const auto& t : family.rules[i].megatron_core) {
      std::map<std::string, long> v;
      if (!patterns::match_name_template(t, name, v)) continue;
      const auto l = v.find("{L}"), e = v.find("{E}");
      return Matched{i, l == v.end() ? -1 : l->second, e == v.end() ? -1 : e->second};
    }
  return std::nullopt;
}

std::vector<std::string> hf_names(const Family& family, const Matched& m) {
  std::vector<std::string> out;
  for (const auto& n : family.rules.at(m.rule).hf) out.push_back(filled(n, m.layer, m.expert));
  return out;
}

}  // namespace ucpkit::formats::hf
