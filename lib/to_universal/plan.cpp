// Extraction plans as JSON, and the size-balanced split across ranks.
#include "to_universal/plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "io/shape.h"

namespace ucpkit::to_universal {

int64_t ParamPlan::numel() const {
  int64_t n = 0;
  for (const auto& s : tp_shapes) n += numel_of(s);
  return n;
}

nlohmann::json ExtractPlan::to_json() const {
  nlohmann::json j;
  j["format"] = "ucpkit-extract-plan";
  j["version"] = 1;
  j["source"] = source.to_json();
  j["patterns"] = patterns_json;
  j["patterns_origin"] = patterns_origin;
  j["files"] = files;
  j["model_files"] = model_files;
  j["optimizer_state_file"] = optimizer_state_file;
  j["optimizer_state_prepared"] = optimizer_state_prepared;
  j["unused_patterns"] = unused_patterns;
  auto& ps = j["params"] = nlohmann::json::array();
  for (const auto& p : params) {
    nlohmann::json e;
    e["name"] = p.name;
    e["tp_shapes"] = p.tp_shapes;
    e["states"] = p.states;
    e["step"] = {p.step_file, p.step_group};
    e["pp_stage"] = p.pp_stage;
    if (p.expert >= 0) e["expert"] = {p.moe_layer, p.expert};
    if (p.autoep_experts > 0) e["autoep"] = {p.moe_layer, p.autoep_experts};
    auto& fr = e["fragments"] = nlohmann::json::array();
    for (const auto& tp : p.fragments) {
      auto row = nlohmann::json::array();
      for (const auto& f : tp) row.push_back({f.file, f.group, f.offset, f.numel, f.part});
      fr.push_back(row);
    }
    ps.push_back(std::move(e));
  }
  return j;
}

ExtractPlan ExtractPlan::from_json(const nlohmann::json& j, const std::string& file) {
  ExtractPlan p;
  p.source = formats::universal::UniversalSource::from_json(j.at("source"), file);
  p.patterns_json = j.at("patterns");
  p.patterns_origin = j.value("patterns_origin", "");
  p.files = j.at("files").get<std::vector<std::string>>();
  p.model_files = j.at("model_files").get<std::vector<std::string>>();
  p.optimizer_state_file = j.at("optimizer_state_file").get<std::string>();
  p.optimizer_state_prepared = j.at("optimizer_state_prepared").get<bool>();
  p.unused_patterns = j.value("unused_patterns", std::vector<std::string>{});
  for (const auto& e : j.at("params")) {
    ParamPlan q;
    q.name = e.at("name").get<std::string>();
    q.tp_shapes = e.at("tp_shapes").get<std::vector<std::vector<int64_t>>>();
    q.states = e.at("states").get<std::vector<std::string>>();
    q.step_file = e.at("step")[0].get<int>();
    q.step_group = e.at("step")[1].get<int>();
    q.pp_stage = e.value("pp_stage", 0);
    if (e.contains("expert")) {
      q.moe_layer = e["expert"][0].get<int>();
      q.expert = e["expert"][1].get<int>();
    }
    if (e.contains("autoep")) {
      q.moe_layer = e["autoep"][0].get<int>();
      q.autoep_experts = e["autoep"][1].get<int>();
    }
    for (const auto& row : e.at("fragments")) {
      std::vector<SourceFragment> fs;
      for (const auto& f : row)
        fs.push_back({f[0].get<int>(), f[1].get<int>(), f[2].get<int64_t>(), f[3].get<int64_t>(), f[4].get<int>()});
      q.fragments.push_back(std::move(fs));
    }
    p.params.push_back(std::move(q));
  }
  return p;
}

patterns::PatternSet ExtractPlan::pattern_set() const { return patterns::PatternSet::from_json(patterns_json, patterns_origin); }

std::string param_folder(const std::string& name) {
  // No PyTorch parameter is named so; as a folder they would write beside zero/<param>/ (names come
  // from the checkpoint's pickles, or a work folder's plan.json).
  if (name.empty() || name == "." || name == "..")
    throw Error("parameter name '" + name + "' cannot name a folder (corrupt param_slice_mappings or plan.json)");
  std::string s = name;
  for (char& c : s)
    if (c == '/') c = '_';
  return s;
}

}  // namespace ucpkit::to_universal
