// The cluster sizes and the fault tolerance of a moe-replace run: what the command line gave (each
// value optional), and the values the run uses, each given or taken from the plan it re-places
// (--current or --previous). Fault tolerance is said in node failures survived, K; the placement
// works with f = K + 1 (every expert on at least f distinct nodes); --fault-tolerance F is the old
// spelling of f.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "placement/cluster.h"
#include "placement/plan.h"

namespace ucpkit::placement {

struct ClusterRequest {
  std::optional<int> nodes, gpus_per_node, slots_per_gpu;  // --nodes --gpus-per-node --slots-per-gpu
  std::optional<int> survive_node_failures;                // --survive-node-failures K
  std::optional<int> fault_tolerance;                      // --fault-tolerance F (= K + 1)
};

// The plan a run re-places: its sizes and fault tolerance are the defaults.
struct BasePlan {
  const Plan* plan = nullptr;
  std::string option;  // "--current" or "--previous"
  std::string path;
};

struct ResolvedCluster {
  Cluster cluster;
  int fault_tolerance = 1;  // f = K + 1
  // Values taken from the base plan, by their plan JSON keys ({"nodes": 4, "survives_node_failures": 1}).
  nlohmann::json from_plan = nlohmann::json::object();
  std::string said;  // one line for the user naming the values taken ("" when none)
};

// Checks the request against itself and the base plan: a size given that disagrees with the base
// plan, both fault-tolerance spellings given and disagreeing, a size missing without a base plan,
// K < 0 or F < 1 are UsageErrors naming the options (and the base plan). A fault tolerance given
// replaces the base plan's; unset, it is the base plan's, or K = 0 (f = 1) without one.
ResolvedCluster resolve_cluster(const ClusterRequest& request, const BasePlan& base = {});

// How messages name a fault tolerance f: "--survive-node-failures K (--fault-tolerance F)".
std::string fault_tolerance_option(int f);
// "survives K node failure(s)".
std::string survives_text(int f);

}  // namespace ucpkit::placement
