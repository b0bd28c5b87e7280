// Node-loss re-placement under the migration model of --previous: what survives on
// the nodes left is the starting placement; the copies that restore f replicas on f nodes are made
// first, then balance moves (or balanced-ft from scratch, aligned) only as far as the migration
// budget and weight allow, and every copy is scheduled in rounds from a surviving GPU.
#pragma once
#include <vector>

#include "placement/migration.h"
#include "placement/plan.h"
#include "placement/replace.h"

namespace ucpkit::placement {

struct NodeLossResult {
  ReplaceResult replacement;  // GPU ids of `target` (the surviving nodes in the current plan's order)
  Migration fetches;          // node-level fetches (physical node ids), as migrate lists them
};

// The current plan's placement on the nodes that survive: node i of `target` is physical node
// physical_ids[i], which must be in the current plan (no added nodes). Per layer, phy2log on `target`.
std::vector<std::vector<int>> surviving_placement(const Plan& current, const std::vector<int>& physical_ids,
                                                  const Cluster& target);

// Re-places `current` after the loss of the nodes not in physical_ids for `loads` on `target`
// (replace_with_migration with lost experts allowed); `next` receives the plan's layers and node ids.
NodeLossResult replace_after_node_loss(const Plan& current, const std::vector<int>& physical_ids,
                                       const LoadMatrix& loads, const Cluster& target, ReplaceOptions options,
                                       Plan& next);

}  // namespace ucpkit::placement
