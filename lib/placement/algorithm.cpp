// Placement algorithm registry.
#include "placement/algorithm.h"

#include "core/error.h"
#include "core/registry.h"

namespace ucpkit::placement {
namespace {
Registry<PlacementAlgorithm>& registry() {
  static Registry<PlacementAlgorithm> r("algorithm");
  return r;
}
}  // namespace

void register_algorithm(const std::string& name, AlgorithmFactory factory) { registry().add(name, std::move(factory)); }

std::vector<std::string> algorithm_names() { return registry().names(); }

std::unique_ptr<PlacementAlgorithm> make_algorithm(const std::string& name) { return registry().make(name); }

void check_fits(const LoadMatrix& loads, const Cluster& cluster) {
  if (static_cast<long long>(loads.experts) > cluster.slots())
    throw UsageError(std::to_string(loads.experts) + " experts do not fit in " + std::to_string(cluster.slots()) +
                     " replica slots (" + cluster.describe() + ")");
}

void check_placement(const LayerPlacement& layer, const Cluster& cluster, int experts, const std::string& algorithm) {
  if (static_cast<int>(layer.phy2log.size()) != cluster.slots() || layer.phyrank.size() != layer.phy2log.size())
    throw Error("internal: " + algorithm + " produced a placement of the wrong size");
  std::vector<int> cnt(experts, 0);
  for (int e : layer.phy2log) {
    if (e < 0 || e >= experts) throw Error("internal: " + algorithm + " placed an unknown expert");
    cnt[e]++;
  }
  for (int e = 0; e < experts; ++e)
    if (cnt[e] == 0) throw Error("internal: " + algorithm + " left expert " + std::to_string(e) + " without a replica");
}

}  // namespace ucpkit::placement
