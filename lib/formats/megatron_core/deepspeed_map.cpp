// Megatron-DeepSpeed <-> Megatron-Core universal names: the map files and the QKV row order.
#include "formats/megatron_core/deepspeed_map.h"

#include <cctype>
#include <fstream>
#include <map>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "patterns/name_template.h"

namespace ucpkit::formats::megatron_core {



namespace {

MapLayout layout_of(const std::string& s, const std::string& origin, const std::string& where) {
  if (s == "identity") return MapLayout::Identity;
  if (s == "qkv") return MapLayout::Qkv;
  if (s == "fc1") return MapLayout::Fc1;
  throw Error(origin + ": " + where + ".layout: '" + escaped_brief(s, 40) + "' is not one of identity, qkv, fc1");
}

const char* const kPlaceholders[] = {"{L}", "{B}", "{F}", "{H}", "{E}"};

void check_placeholders(const std::string& pattern, bool megatron_core, const std::string& origin,
                        const std::string& where) {
  for (size_t p = 0; (p = pattern.find('{', p)) != std::string::npos; ++p) {
    const size_t close = pattern.find('}', p);
    const std::string key = close == std::string::npos ? pattern.substr(p) : pattern.substr(p, close + 1 - p);
    bool known = false;
    for (const char* k : kPlaceholders) known = known || key == k;
    if (!known || (megatron_core && key != "{L}" && key != "{E}"))
      throw Error(origin + ": " + where + ": placeholder '" + escaped_brief(key, 20) + "' is not one of " +
                  (megatron_core ? "{L} {E}" : "{L} {B} {F} {H} {E}"));
  }
}

}  // namespace

ModelMap ModelMap::from_json(const nlohmann::json& j, const std::string& origin) {
  ModelMap m;
  m.origin = origin;
  m.json = j;
  if (!j.is_object() || j.value("format", std::string()) != kModelMapFormat)
    throw Error(origin + ": not a Megatron-Core name map (\"format\": \"" + std::string(kModelMapFormat) + "\" expected)");
  if (!j.contains("family") || !j["family"].is_string()) throw Error(origin + ": \"family\" must be a string");
  m.family = j["family"].get<std::string>();
  if (!j.contains("params") || !j["params"].is_array() || j["params"].empty())
    throw Error(origin + ": \"params\" must be a non-empty list of rules");
  for (size_t i = 0; i < j["params"].size(); ++i) {
    const nlohmann::json& r = j["params"][i];
    const std::string where = "params[" + std::to_string(i) + "]";
    if (!r.is_object() || !r.contains("megatron_core") || !r["megatron_core"].is_string() ||
        !r.contains("megatron_deepspeed"))
      throw Error(origin + ": " + where + " needs \"megatron_deepspeed\" (a name or a list) and \"megatron_core\" (a name)");
    MapRule rule;
    rule.megatron_core = r["megatron_core"].get<std::string>();
    check_placeholders(rule.megatron_core, true, origin, where + ".megatron_core");
    const nlohmann::json& ds = r["megatron_deepspeed"];
    if (ds.is_string()) {
      rule.deepspeed.push_back(ds.get<std::string>());
    } else if (ds.is_array()) {
      for (const auto& s : ds) {
        if (!s.is_string()) throw Error(origin + ": " + where + ".megatron_deepspeed: names must be strings");
        rule.deepspeed.push_back(s.get<std::string>());
      }
    } else {
      throw Error(origin + ": " + where + ".megatron_deepspeed must be a name or a list of names");
    }
    for (const auto& s : rule.deepspeed) check_placeholders(s, false, origin, where + ".megatron_deepspeed");
    if (r.contains("layout")) {
      if (!r["layout"].is_string()) throw Error(origin + ": " + where + ".layout must be a string");
      rule.layout = layout_of(r["layout"].get<std::string>(), origin, where);
    }
    m.rules.push_back(std::move(rule));
  }
  return m;
}

ModelMap read_model_map(const std::string& path) {
  const std::string text = read_text_file(path, "model map");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": not JSON (" + std::string(e.what()) + ")");
  }
  return ModelMap::from_json(j, path);
}

std::vector<ModelMap> shipped_model_maps() {
  std::vector<ModelMap> out;
  for (const auto& [name, text] : shipped_model_map_texts())
    out.push_back(ModelMap::from_json(nlohmann::json::parse(text), "shipped:patterns/megatron-core/" + name));
  return out;
}

std::optional<MappedName> to_megatron_core(const ModelMap& map, const std::string& name, const PipeNumbering& pn) {
  for (size_t r = 0; r < map.rules.size(); ++r) {
    const MapRule& rule = map.rules[r];
    for (const auto& pattern : rule.deepspeed) {
      std::map<std::string, long> v;
      if (!patterns::match_name_template(pattern, name, v)) continue;
      // Pipeline spellings are only meaningful for PipelineModule names, and must name the layer the
      // source's numbering gives.
      if (v.count("{B}")) {
        if (pn.first_block < 0 || v["{B}"] < pn.first_block) continue;
        v["{L}"] = v["{B}"] - pn.first_block;
      }
      if (v.count("{F}") && (pn.final_norm < 0 || v["{F}"] != pn.final_norm)) continue;
      if (v.count("{H}") && (pn.head < 0 || v["{H}"] != pn.head)) continue;
      MappedName m;
      m.rule = r;
      m.name = rule.megatron_core;
      if (v.count("{L}")) {
        m.layer = static_cast<int>(v["{L}"]);
        m.name = patterns::substitute_placeholder(m.name, "{L}", v["{L}"]);
      }
      if (v.count("{E}")) {
        m.expert = static_cast<int>(v["{E}"]);
        m.name = patterns::substitute_placeholder(m.name, "{E}", v["{E}"]);
      }
      return m;
    }
  }
  return std::nullopt;
}

namespace {

void check_qkv_rows(size_t dims, int64_t rows, const QkvShape& s) {
  if (s.heads <= 0 || s.groups <= 0 || s.head_dim <= 0 || s.heads % s.groups != 0)
    throw Error("QKV layout: " + std::to_string(s.heads) + " query heads do not split into " + std::to_string(s.groups) +
                " query groups");
  if (dims < 1 || rows != (s.heads + 2 * s.groups) * s.head_dim)
    throw Error("QKV layout: " + std::to_string(dims ? rows : 0) + " rows, expected (" + std::to_string(s.heads) +
                " + 2 x " + std::to_string(s.groups) + ") heads x " + std::to_string(s.head_dim));
}

void check_qkv(const Tensor& t, const QkvShape& s) {
  check_qkv_rows(static_cast<size_t>(t.dim()), t.dim() ? t.shape()[0] : 0, s);
}

}  // namespace

Tensor qkv_split_to_grouped(const Tensor& t, const QkvShape& s) {
  check_qkv(t, s);
  const int64_t per = s.heads / s.groups, d = s.head_dim, q = s.heads * d, kv = s.groups * d;
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < s.groups; ++g) {
    parts.push_back(t.narrow(0, g * per * d, per * d));
    parts.push_back(t.narrow(0, q + g * d, d));
    parts.push_back(t.narrow(0, q + kv + g * d, d));
  }
  return cat(parts, 0);
}

Tensor qkv_grouped_to_split(const Tensor& t, const QkvShape& s) {
  check_qkv(t, s);
  const int64_t per = s.heads / s.groups, d = s.head_dim, stride = (per + 2) * d;
  std::vector<Tensor> qs, ks, vs;
  for (int64_t g = 0; g < s.groups; ++g) {
    qs.push_back(t.narrow(0, g * stride, per * d));
    ks.push_back(t.narrow(0, g * stride + per * d, d));
    vs.push_back(t.narrow(0, g * stride + (per + 1) * d, d));
  }
  std::vector<Tensor> parts = qs;
  parts.insert(parts.end(), ks.begin(), ks.end());
  parts.insert(parts.end(), vs.begin(), vs.end());
  return cat(parts, 0);
}

std::vector<RowRun> qkv_grouped_to_split_rows(size_t dims, int64_t rows, const QkvShape& s) {
  check_qkv_rows(dims, rows, s);
  const int64_t per = s.heads / s.groups, d = s.head_dim, stride = (per + 2) * d;
  std::vector<RowRun> runs;
  int64_t out = 0;
  for (int64_t g = 0; g < s.groups; ++g, out += per * d) runs.push_back({out, g * stride, per * d});  // Q
  for (int64_t g = 0; g < s.groups; ++g, out += d) runs.push_back({out, g * stride + per * d, d});      // K
  for (int64_t g = 0; g < s.groups; ++g, out += d) runs.push_back({out, g * stride + (per + 1) * d, d});  // V
  return runs;
}

}  // namespace ucpkit::formats::megatron_core
