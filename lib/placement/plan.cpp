// Plan metrics and the plan JSON schema in one place.
#include "placement/plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/atomic_file.h"
#include "core/error.h"
#include "placement/balance.h"

namespace ucpkit::placement {
namespace {

using json = nlohmann::json;

double round6(double v) { return std::round(v * 1e6) / 1e6; }

json recovery_json(const std::vector<RecoveryEstimate>& r) {
  json o = json::object();
  for (const auto& e : r) o[std::to_string(e.failed_nodes)] = e.probability;
  return o;
}

json recovery_detail(const std::vector<RecoveryEstimate>& r) {
  json o = json::object();
  for (const auto& e : r) {
    json d = {{"method", e.exact ? "exact" : "monte_carlo"}};
    if (!e.exact) {
      d["samples"] = e.samples;
      d["ci95"] = {e.ci_low, e.ci_high};
    }
    o[std::to_string(e.failed_nodes)] = d;
  }
  return o;
}

}  // namespace

void compute_metrics(Plan& plan, const LoadMatrix& loads, const RecoveryOptions& options) {
  plan.recovery_options = options;
  RecoveryModel model(plan.cluster.nodes, options);
  auto survivals = model.new_survivals();
  plan.layer_metrics.clear();
  std::vector<std::vector<RecoveryEstimate>> per_layer;
  double sum_mean = 0, sum_max = 0, min_b = 1;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    LayerMetrics m;
    std::vector<double> t = loads.layer_vector(l);
    m.gpu_loads = gpu_loads(plan.layers[l].phy2log, t, plan.cluster);
    m.max_load = *std::max_element(m.gpu_loads.begin(), m.gpu_loads.end());
    m.mean_load = std::accumulate(m.gpu_loads.begin(), m.gpu_loads.end(), 0.0) / m.gpu_loads.size();
    m.balancedness = balancedness(m.gpu_loads);
    m.recovery = model.evaluate(ExpertNodeSets::from_layer(plan.layers[l].phy2log, plan.cluster, plan.experts), &survivals);
    sum_mean += m.mean_load;
    sum_max += m.max_load;
    min_b = std::min(min_b, m.balancedness);
    per_layer.push_back(m.recovery);
    plan.layer_metrics.push_back(std::move(m));
  }
  plan.metrics.balancedness = sum_max > 0 ? sum_mean / sum_max : 1.0;
  plan.metrics.min_balancedness = min_b;
  plan.metrics.recovery = model.aggregate(per_layer, survivals);
}

json plan_to_json(const Plan& plan) {
  json doc = {{"nodes", plan.cluster.nodes},
              {"gpus_per_node", plan.cluster.gpus_per_node},
              {"slots_per_gpu", plan.cluster.slots_per_gpu},
              {"algorithm", plan.algorithm},
              {"experts", plan.experts},
              {"fault_tolerance", plan.fault_tolerance}};
  if (!plan.node_ids.empty()) doc["node_ids"] = plan.node_ids;
  int width = 1;
  std::vector<std::vector<int>> counts;
  for (const auto& layer : plan.layers) {
    counts.push_back(logical_counts(layer.phy2log, plan.experts));
    width = std::max(width, *std::max_element(counts.back().begin(), counts.back().end()));
  }
  json layers = json::array();
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    json L = {{"phy2log", plan.layers[l].phy2log},
              {"log2phy", log2phy(plan.layers[l], plan.experts, width)},
              {"logcnt", counts[l]}};
    if (l < plan.layer_metrics.size()) {
      const auto& m = plan.layer_metrics[l];
      L["balancedness"] = m.balancedness;
      L["recovery_probability"] = recovery_json(m.recovery);
      L["recovery_method"] = recovery_detail(m.recovery);
      json g = json::array();
      for (double v : m.gpu_loads) g.push_back(round6(v));
      L["gpu_loads"] = g;
      L["max_gpu_load"] = m.max_load;
      L["mean_gpu_load"] = m.mean_load;
    }
    layers.push_back(std::move(L));
  }
  doc["layers"] = std::move(layers);
  json metrics = {{"balancedness", plan.metrics.balancedness},
                  {"min_balancedness", plan.metrics.min_balancedness},
                  {"recovery_probability", recovery_json(plan.metrics.recovery)}};
  json ci = json::object();
  for (const auto& e : plan.metrics.recovery) ci[std::to_string(e.failed_nodes)] = {e.ci_low, e.ci_high};
  metrics["recovery_ci95"] = ci;
  metrics["recovery_method"] = recovery_detail(plan.metrics.recovery);
  metrics["monte_carlo"] = {{"samples", plan.recovery_options.mc_samples},
                            {"seed", plan.recovery_options.seed},
                            {"exact_limit", plan.recovery_options.exact_limit}};
  doc["metrics"] = std::move(metrics);
  for (auto it = plan.details.begin(); it != plan.details.end(); ++it) doc[it.key()] = it.value();
  return doc;
}

Plan plan_from_json(const json& doc, const std::string& name) {
  Plan plan;
  try {
    if (!doc.is_object()) fail(name, "a plan must be a JSON object");
    for (const char* key : {"nodes", "gpus_per_node", "slots_per_gpu", "layers"})
      if (!doc.contains(key)) fail(name, std::string("plan lacks \"") + key + "\"");
    plan.cluster = {doc["nodes"].get<int>(), doc["gpus_per_node"].get<int>(), doc["slots_per_gpu"].get<int>()};
    if (plan.cluster.nodes <= 0 || plan.cluster.gpus_per_node <= 0 || plan.cluster.slots_per_gpu <= 0)
      fail(name, "plan sizes must be positive");
    plan.algorithm = doc.value("algorithm", std::string("unknown"));
    int max_e = -1;
    for (const auto& L : doc["layers"]) {
      LayerPlacement lp;
      lp.phy2log = L.at("phy2log").get<std::vector<int>>();
      if (static_cast<int>(lp.phy2log.size()) != plan.cluster.slots())
        fail(name, "phy2log has " + std::to_string(lp.phy2log.size()) + " slots, expected " +
                       std::to_string(plan.cluster.slots()));
      for (int e : lp.phy2log) {
        if (e < 0) fail(name, "phy2log holds a negative expert id");
        max_e = std::max(max_e, e);
      }
      plan.layers.push_back(std::move(lp));
    }
    if (plan.layers.empty()) fail(name, "plan has no layers");
    plan.experts = doc.value("experts", max_e + 1);
    if (plan.experts <= max_e) fail(name, "phy2log holds an expert id beyond \"experts\"");
    for (auto& lp : plan.layers) lp.phyrank = ranks_by_appearance(lp.phy2log, plan.experts);
    if (doc.contains("node_ids")) {
      plan.node_ids = doc["node_ids"].get<std::vector<int>>();
      if (static_cast<int>(plan.node_ids.size()) != plan.cluster.nodes) fail(name, "node_ids does not list every node");
    } else {
      plan.node_ids.resize(plan.cluster.nodes);
      std::iota(plan.node_ids.begin(), plan.node_ids.end(), 0);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(name, std::string("malformed plan: ") + e.what());
  }
  return plan;
}

Plan read_plan(const std::string& path) {
  json doc;
  try {
    doc = json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("not valid JSON: ") + e.what());
  }
  return plan_from_json(doc, path);
}

}  // namespace ucpkit::placement
