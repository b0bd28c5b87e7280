// Cluster geometry, replica bookkeeping and the in-node GPU layout shared by the node-level planners.
#include "placement/cluster.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace ucpkit::placement {

std::string Cluster::describe() const {
  return std::to_string(nodes) + " nodes x " + std::to_string(gpus_per_node) + " GPUs x " +
         std::to_string(slots_per_gpu) + " slots";
}

void validate_cluster(const Cluster& c) {
  if (c.nodes <= 0) throw UsageError("--nodes must be positive");
  if (c.gpus_per_node <= 0) throw UsageError("--gpus-per-node must be positive");
  if (c.slots_per_gpu <= 0) throw UsageError("--slots-per-gpu must be positive");
  long long slots = 1LL * c.nodes * c.gpus_per_node * c.slots_per_gpu;
  if (slots > std::numeric_limits<int>::max() / 4) throw UsageError("cluster too large: " + c.describe());
}

std::vector<int> logical_counts(const std::vector<int>& phy2log, int experts) {
  std::vector<int> cnt(experts, 0);
  for (int e : phy2log) cnt.at(e)++;
  return cnt;
}

std::vector<int> ranks_by_appearance(const std::vector<int>& phy2log, int experts) {
  std::vector<int> seen(experts, 0), rank(phy2log.size());
  for (size_t p = 0; p < phy2log.size(); ++p) rank[p] = seen.at(phy2log[p])++;
  return rank;
}

std::vector<std::vector<int>> log2phy(const LayerPlacement& layer, int experts, int width) {
  std::vector<std::vector<int>> out(experts, std::vector<int>(width, -1));
  for (size_t p = 0; p < layer.phy2log.size(); ++p) {
    int e = layer.phy2log[p], r = layer.phyrank[p];
    if (r < width) out[e][r] = static_cast<int>(p);
  }
  return out;
}

LayerPlacement layout_nodes(const std::vector<std::vector<int>>& node_experts, const std::vector<double>& loads,
                            const Cluster& cluster) {
  const int experts = static_cast<int>(loads.size());
  std::vector<int> count(experts, 0);
  for (const auto& n : node_experts)
    for (int e : n) count.at(e)++;
  auto replica_load = [&](int e) { return count[e] ? loads[e] / count[e] : 0.0; };

  const int G = cluster.gpus_per_node, S = cluster.slots_per_gpu;
  LayerPlacement out;
  out.phy2log.assign(cluster.slots(), -1);
  for (int node = 0; node < cluster.nodes; ++node) {
    std::vector<int> reps = node_experts.at(node);
    if (static_cast<int>(reps.size()) != G * S) throw Error("internal: node " + std::to_string(node) + " not full");
    std::stable_sort(reps.begin(), reps.end(), [&](int a, int b) { return replica_load(a) > replica_load(b); });
    std::vector<double> gload(G, 0.0);
    std::vector<std::vector<int>> gslots(G);
    for (int e : reps) {
      int best = -1;
      bool best_lacks = false;
      for (int g = 0; g < G; ++g) {
        if (static_cast<int>(gslots[g].size()) >= S) continue;
        bool lacks = std::find(gslots[g].begin(), gslots[g].end(), e) == gslots[g].end();
        if (best < 0 || gload[g] < gload[best] - 1e-12 || (gload[g] <= gload[best] + 1e-12 && lacks && !best_lacks)) {
          best = g;
          best_lacks = lacks;
        }
      }
      gslots[best].push_back(e);
      gload[best] += replica_load(e);
    }
    for (int g = 0; g < G; ++g)
      for (int s = 0; s < S; ++s) out.phy2log[(node * G + g) * S + s] = gslots[g][s];
  }
  out.phyrank = ranks_by_appearance(out.phy2log, experts);
  return out;
}

}  // namespace ucpkit::placement
