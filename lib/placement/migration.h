// Re-placement after node failures, node additions or a rebalance: map the new plan's nodes onto
// physical nodes so that the fewest replicas move, and schedule the transfers.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "placement/plan.h"

namespace ucpkit::placement {

struct NodeChange {
  std::vector<int> failed;  // physical node ids (the current plan's node_ids)
  int added = 0;
};

// One expert state fetched by node `to` from node `from` (physical ids; from = -1: no surviving
// owner, the expert must come from a checkpoint).
struct Transfer {
  int layer, expert, from, to;
};

struct Migration {
  std::vector<int> node_ids;               // physical id of each node of the new plan
  std::vector<long long> moved_per_layer;  // (node, expert) pairs a node must fetch
  long long replicas_moved = 0;
  std::vector<Transfer> transfers;
  std::vector<std::pair<int, int>> lost;  // (layer, expert) with no replica left
};

// Physical ids of the nodes after the change: survivors in order, then new ids past the largest.
// Throws UsageError for a failed node that is not in the plan, duplicates, or no node left.
std::vector<int> nodes_after_change(const Plan& current, const NodeChange& change);

// Minimum-cost perfect matching of a square cost matrix (Hungarian algorithm, O(n^3)): the column
// of every row.
std::vector<int> min_cost_assignment(const std::vector<std::vector<long long>>& cost);

// Permutes the nodes of `next` (planned on logical nodes) onto `physical_ids` so that the number of
// (layer, node, expert) fetches is minimal over all node permutations (an optimal assignment on the
// cost "experts the physical node lacks", summed over layers), then matches the GPUs inside each
// node the same way (fewest experts a GPU lacks; this does not change the fetch count); then lists
// the fetches, each from the surviving owner of that expert with the fewest sends so far.
Migration migrate(const Plan& current, Plan& next, const std::vector<int>& physical_ids);

// The fetches of `next`, whose node i is physical node physical_ids[i], from `current`: every
// (layer, node, expert) that node did not hold, from the surviving owner with the fewest sends so far
// (from = -1 and listed in `lost` when no surviving node held it). The listing step of migrate.
Migration list_fetches(const Plan& current, const Plan& next, const std::vector<int>& physical_ids);

nlohmann::json migration_to_json(const Migration& m, double expert_bytes);

}  // namespace ucpkit::placement
