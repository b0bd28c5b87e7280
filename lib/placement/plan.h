// The placement plan: per-layer EPLB-compatible maps plus metrics, and its JSON form.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "placement/cluster.h"
#include "placement/loads.h"
#include "placement/recovery.h"

namespace ucpkit::placement {

struct LayerMetrics {
  std::vector<double> gpu_loads;
  double mean_load = 0, max_load = 0, balancedness = 1;
  std::vector<RecoveryEstimate> recovery;  // k = 1..K
};

struct PlanMetrics {
  double balancedness = 1;                 // sum of layer means / sum of layer maxima
  double min_balancedness = 1;             // worst layer
  std::vector<RecoveryEstimate> recovery;  // mean over layers
};

struct Plan {
  Cluster cluster;
  std::string algorithm;
  int experts = 0;
  int fault_tolerance = 1;
  std::vector<LayerPlacement> layers;
  std::vector<int> node_ids;  // physical id of every plan node (identity unless re-placed)
  std::vector<LayerMetrics> layer_metrics;
  PlanMetrics metrics;
  RecoveryOptions recovery_options;
  nlohmann::json details = nlohmann::json::object();
};

// Fills layer_metrics and metrics: GPU loads, balancedness, recovery probabilities.
void compute_metrics(Plan& plan, const LoadMatrix& loads, const RecoveryOptions& options);

// The plan file: {"nodes","gpus_per_node","slots_per_gpu","algorithm","layers":[{"phy2log","log2phy",
// "logcnt","balancedness","recovery_probability":{"1":..}, ...}],"metrics":{...}} plus extra keys.
// plan_json_text writes the same document fast (large integer arrays by hand), with `extra` keys
// (e.g. "migration") added at the top level.
nlohmann::json plan_to_json(const Plan& plan);
// `raw`: string values of `extra` replaced verbatim by pre-serialized JSON text (first: the value as
// dumped, quotes included, e.g. "\"@transfers\""), so a large array (a re-placement's million
// transfers) is written once as text instead of being built, and copied, as JSON objects.
std::string plan_json_text(const Plan& plan, const nlohmann::json& extra = nlohmann::json::object(),
                           const std::vector<std::pair<std::string, std::string>>& raw = {});
// The same text in pieces to `sink`: each piece at least `chunk` bytes, except the last, a log2phy
// row's padding of 4 KB or more (a piece of its own, not copied) and the piece just before such a
// padding (chunk 0: the whole text in one piece). A raw value is written by its writer, which may
// call the sink it is given any number of times.
using TextSink = std::function<void(std::string_view)>;
using RawWriter = std::function<void(const TextSink&)>;
void write_plan_json(const Plan& plan, const nlohmann::json& extra,
                     const std::vector<std::pair<std::string, RawWriter>>& raw, const TextSink& sink,
                     size_t chunk = size_t{4} << 20);
// The fault tolerance a plan guarantees: the fewest distinct nodes any expert of any layer sits on
// (every expert keeps a replica when fewer nodes than that fail). plan_placement (planner.h) records
// min(requested f, this) as the plan's fault_tolerance, and "fault_tolerance_requested" when lower.
int guaranteed_fault_tolerance(const Plan& plan);

// Reads the keys a re-placement needs (sizes, phy2log per layer, node_ids); throws Error naming `name`.
Plan plan_from_json(const nlohmann::json& doc, const std::string& name);
Plan read_plan(const std::string& path);

}  // namespace ucpkit::placement
