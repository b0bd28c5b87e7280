// lazarus: Lazarus allocation, MRO node placement, GPU balancing inside nodes.
#include <algorithm>
#include <numeric>

#include "placement/algorithm.h"
#include "placement/allocation.h"
#include "placement/balance.h"
#include "placement/lpt_fill.h"
#include "placement/mro.h"

namespace ucpkit::placement {
namespace {

// The same replicas packed for balance alone: heaviest replica first onto the least loaded GPU with
// a free slot (optionally preferring GPUs on nodes that do not hold the expert yet, until every node
// holds it): lpt_fill.h, NodeRule::new_nodes_first (a std::set of GPUs before, 4.5 s at 1,024 nodes).
LayerPlacement balanced_layout(const std::vector<int>& r, const std::vector<double>& loads, const Cluster& cluster,
                               bool prefer_new_node) {
  LayerPlacement out;
  out.phy2log = lpt_pack(r, loads, cluster, prefer_new_node ? NodeRule::new_nodes_first : NodeRule::any);
  out.phyrank = ranks_by_appearance(out.phy2log, static_cast<int>(r.size()));
  return out;
}

// True when `cand` recovers at least as often as `base` for every k, checked from k = 1 up so a
// worse candidate is usually rejected on the cheap small k. `base` is filled lazily.
bool no_worse(const RecoveryModel& model, const ExpertNodeSets& cand, const ExpertNodeSets& base_sets,
              std::vector<RecoveryEstimate>& base) {
  for (int k = 1; k <= model.max_failures(); ++k) {
    if (static_cast<int>(base.size()) < k) base.push_back(model.evaluate_one(base_sets, k));
    if (model.evaluate_one(cand, k).probability < base[k - 1].probability - 1e-12) return false;
  }
  return true;
}

// Experts of every node, from a layer's slots.
std::vector<std::vector<int>> node_contents(const std::vector<int>& phy2log, const Cluster& cluster) {
  std::vector<std::vector<int>> nodes(cluster.nodes);
  for (size_t p = 0; p < phy2log.size(); ++p) nodes[cluster.node_of_slot(static_cast<int>(p))].push_back(phy2log[p]);
  return nodes;
}

// Small clusters: every k = 1..N-1, exactly (a layout that ties for the k reported can still lose at
// a larger k, e.g. N = 6, c = 3, r = (1, 7, 10): p(5) = 0 instead of 1/6).
constexpr int kAllFailuresUpTo = 12;

bool no_worse_all_k(const std::vector<double>& cand, const std::vector<double>& base) {
  for (size_t i = 0; i < base.size(); ++i)
    if (cand[i] < base[i] - 1e-12) return false;
  return true;
}

class Lazarus : public PlacementAlgorithm {
 public:
  std::string name() const override { return "lazarus"; }
  std::string description() const override {
    return "Lazarus allocation (replicas ~ load, at least f) + maximum-rank-overlap node placement";
  }
  PlacementResult place(const LoadMatrix& loads, const Cluster& cluster, const PlacementOptions& opt) const override {
    check_fits(loads, cluster);
    const int E = static_cast<int>(loads.experts);
    const int c = cluster.slots_per_node();
    RecoveryModel model(cluster.nodes, opt.recovery);
    PlacementResult res;
    auto& chosen = res.details["lazarus_layout"] = nlohmann::json::array();
    for (size_t l = 0; l < loads.layers; ++l) {
      std::vector<double> t = loads.layer_vector(l);
      std::vector<int> r = lazarus_allocation(t, cluster.nodes, c, opt.fault_tolerance);
      MroOptions mo;
      mo.fault_tolerance = opt.fault_tolerance;
      LayerPlacement mro = layout_nodes(mro_placement(r, t, cluster.nodes, c, mo), t, cluster);
      // MRO is one optimal placement for recovery; when a purely balance-driven packing of the same
      // replicas is as recoverable for every k (k = 1..N-1 exactly when N <= 12, else k = 1..K with
      // the same Monte Carlo samples), take it: the balance is then free.
      double best_b = balancedness(mro.phy2log, t, cluster);
      std::vector<RecoveryEstimate> pm;
      const ExpertNodeSets mro_sets = ExpertNodeSets::from_layer(mro.phy2log, cluster, E);
      const bool all_k = cluster.nodes <= kAllFailuresUpTo;
      std::vector<double> mro_vector;
      if (all_k) mro_vector = exact_recovery_vector(node_contents(mro.phy2log, cluster), E);
      int pick = 0;
      LayerPlacement best = std::move(mro);
      for (int variant = 1; variant <= 2; ++variant) {
        LayerPlacement cand = balanced_layout(r, t, cluster, variant == 2);
        double b = balancedness(cand.phy2log, t, cluster);
        if (b <= best_b + 1e-9) continue;
        if (all_k ? !no_worse_all_k(exact_recovery_vector(node_contents(cand.phy2log, cluster), E), mro_vector)
                  : !no_worse(model, ExpertNodeSets::from_layer(cand.phy2log, cluster, E), mro_sets, pm))
          continue;
        best = std::move(cand);
        best_b = b;
        pick = variant;
      }
      bool use_bal = pick != 0;
      chosen.push_back(use_bal ? "balanced" : "mro");
      res.layers.push_back(std::move(best));
    }
    return res;
  }
};

const AlgorithmRegistrar kLazarusRegistrar("lazarus", [] { return std::make_unique<Lazarus>(); });

}  // namespace
}  // namespace ucpkit::placement
