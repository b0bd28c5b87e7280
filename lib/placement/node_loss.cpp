// Node-loss re-placement under the migration model (see node_loss.h and docs/moe-replace.md).
#include "placement/node_loss.h"

#include <map>

#include "core/error.h"

namespace ucpkit::placement {

std::vector<std::vector<int>> surviving_placement(const Plan& current, const std::vector<int>& physical_ids,
                                                  const Cluster& target) {
  if (target.gpus_per_node != current.cluster.gpus_per_node || target.slots_per_gpu != current.cluster.slots_per_gpu)
    throw Error("internal: node-loss re-placement keeps the GPUs per node and slots per GPU");
  std::map<int, int> index;  // physical id -> node index in the current plan
  for (size_t i = 0; i < current.node_ids.size(); ++i) index[current.node_ids[i]] = static_cast<int>(i);
  const int c = target.slots_per_node();
  std::vector<std::vector<int>> out(current.layers.size(), std::vector<int>(target.slots()));
  for (size_t i = 0; i < physical_ids.size(); ++i) {
    auto it = index.find(physical_ids[i]);
    if (it == index.end())
      throw UsageError("--migration-weight and --max-moved-bytes with --current apply to --failed-nodes; node " +
                       std::to_string(physical_ids[i]) + " is not in the current plan");
    for (size_t l = 0; l < current.layers.size(); ++l)
      std::copy_n(current.layers[l].phy2log.begin() + static_cast<long>(it->second) * c, c,
                  out[l].begin() + static_cast<long>(i) * c);
  }
  return out;
}

NodeLossResult replace_after_node_loss(const Plan& current, const std::vector<int>& physical_ids,
                                       const LoadMatrix& loads, const Cluster& target, ReplaceOptions options,
                                       Plan& next) {
  const std::vector<std::vector<int>> before = surviving_placement(current, physical_ids, target);
  options.lost_allowed = true;
  options.count_node_fetches = true;
  NodeLossResult out;
  out.replacement = replace_with_migration(before, loads, target, options);
  next.cluster = target;
  next.experts = static_cast<int>(loads.experts);
  next.fault_tolerance = options.fault_tolerance;
  next.layers = out.replacement.layers;
  next.node_ids = physical_ids;
  out.fetches = list_fetches(current, next, physical_ids);
  return out;
}

}  // namespace ucpkit::placement
