// The moe-replace pipeline as plain data in, plain data out: read loads -> place -> (migrate) ->
// metrics -> plan JSON, table and SVG text. Nothing is written here; the driver writes atomically.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "placement/algorithm.h"
#include "placement/cluster_request.h"
#include "placement/layers_map.h"
#include "placement/loads.h"
#include "placement/migration.h"
#include "placement/min_recovery.h"
#include "placement/plan.h"
#include "placement/replace.h"

namespace ucpkit::placement {

struct PlanRequest {
  std::string loads_path;
  LoadFileOptions load_options;
  // --nodes/--gpus-per-node/--slots-per-gpu (the cluster before any change) and the fault tolerance
  // (--survive-node-failures K or --fault-tolerance F): each unset one is the --current or --previous
  // plan's (cluster_request.h).
  ClusterRequest sizes;
  std::string algorithm = "balanced-ft";
  PlacementOptions placement;  // its fault_tolerance is set from `sizes`
  std::string current_path;    // re-placement when set
  NodeChange change;
  // Migration-aware re-placement for new loads on the same cluster (replace.h) when set.
  std::string previous_path;
  double max_moved_bytes = -1;  // < 0: no budget
  double migration_weight = 0;
  // --current --failed-nodes with --migration-weight or --max-moved-bytes: node-loss re-placement under
  // the migration model (node_loss.h) instead of a new plan matched onto the surviving nodes.
  bool node_loss_migration = false;
  bool report = false;  // --report: every algorithm on the same workload (Pareto table)
  bool pareto = false;  // --pareto (with --report): balanced-ft's balance/recovery front over --recovery-weight
  // --min-recovery k:p: balanced-ft with the smallest recovery weight whose plan has P(k nodes down) >= p
  // (min_recovery.h); excludes --recovery-weight.
  std::optional<MinRecovery> min_recovery;
  double expert_bytes = 0;  // bytes per expert replica, for "bytes_moved"
  bool want_svg = false;
  bool dispatch = false;     // --dispatch: token dispatch plan (dispatch.h) in the plan and summary
  bool want_sglang = false;  // --sglang-expert-location: SGLang's init file (engine_formats.h)
  bool want_vllm = false;    // --vllm-eplb-state: vLLM EplbModelState tensors (engine_formats.h)
  // --layers-map: the model's decoder layers and which are MoE (layers_map.h): loads with a row per
  // decoder layer are cut to the MoE rows, and the SGLang file gets a row per decoder layer.
  std::optional<LayersMap> layers_map;
  // --pp-size / --pp-layer-partition (with --layers-map): each pipeline stage's decoder layers and MoE
  // rows, reported in the summary (layers_map.pp_stages) and the table.
  std::vector<PpStage> pp_stages;
  int svg_layer = 0;
};

struct PlanOutcome {
  Plan plan;
  std::optional<Migration> migration;
  std::optional<ReplaceResult> replacement;
  // The plan file, hundreds of MB at 1,024 nodes, is never held whole: write_plan_file writes it in
  // pieces to `sink` from `plan`, `file_extra` (the extra top-level keys) and, after a
  // re-placement, `replacement`'s transfers, nothing copied; plan_file_text() collects it for
  // callers that want the text.
  nlohmann::json file_extra = nlohmann::json::object();
  std::vector<int> transfer_node_ids;  // node loss: physical node ids of the transfers' GPUs
  bool transfers_with_nodes = false;
  void write_plan_file(const TextSink& sink) const;
  std::string plan_file_text() const;
  nlohmann::json summary;          // the --json summary
  std::string table;               // the terminal table (with --report, the Pareto table appended)
  std::string svg;                 // when requested
  std::string sglang_text;         // when requested
  std::string vllm_bytes;          // when requested (safetensors)
  std::vector<std::string> notes;  // warnings for the user (e.g. f lowered after failures)
  std::string said;                // said to the user unless quiet: values taken from --current / --previous
  double seconds = 0;
};

PlanOutcome make_plan(const PlanRequest& request);

// Places `loads` with one algorithm and computes metrics; the piece benchmarks and tests reuse.
Plan plan_placement(const LoadMatrix& loads, const Cluster& cluster, const std::string& algorithm,
                    const PlacementOptions& options);

// Parses "i,j,k" into ids; throws UsageError on anything else.
std::vector<int> parse_id_list(const std::string& text, const std::string& option);

}  // namespace ucpkit::placement
