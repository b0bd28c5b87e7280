// spread baseline: Lazarus's replica counts, each expert's replicas dealt round-robin over the nodes.
#include "placement/algorithm.h"
#include "placement/allocation.h"

namespace ucpkit::placement {
namespace {

class Spread : public PlacementAlgorithm {
 public:
  std::string name() const override { return "spread"; }
  std::string description() const override { return "Lazarus replica counts, replicas round-robin over nodes"; }
  PlacementResult place(const LoadMatrix& loads, const Cluster& cluster, const PlacementOptions& opt) const override {
    check_fits(loads, cluster);
    PlacementResult res;
    for (size_t l = 0; l < loads.layers; ++l) {
      std::vector<double> t = loads.layer_vector(l);
      std::vector<int> r = lazarus_allocation(t, cluster.nodes, cluster.slots_per_node(), opt.fault_tolerance);
      std::vector<std::vector<int>> nodes(cluster.nodes);
      long long next = 0;
      for (size_t e = 0; e < r.size(); ++e)
        for (int i = 0; i < r[e]; ++i) nodes[next++ % cluster.nodes].push_back(static_cast<int>(e));
      res.layers.push_back(layout_nodes(nodes, t, cluster));
    }
    return res;
  }
};

const AlgorithmRegistrar kSpreadRegistrar("spread", [] { return std::make_unique<Spread>(); });

}  // namespace
}  // namespace ucpkit::placement
