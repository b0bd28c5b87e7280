// lazarus: Lazarus allocation, MRO node placement, GPU balancing inside nodes.
#include <algorithm>
#include <numeric>
#include <set>

#include "placement/algorithm.h"
#include "placement/allocation.h"
#include "placement/balance.h"
#include "placement/mro.h"

namespace ucpkit::placement {
namespace {

// The same replicas packed for balance alone: heaviest replica first onto the least loaded GPU with
// a free slot (optionally preferring GPUs on nodes that do not hold the expert yet).
//
// With prefer_new_node, the GPUs of nodes that already hold the current expert are kept aside
// (`blocked`) instead of being skipped on every pick: a pick is then the first open GPU, or the first
// blocked one when every open GPU is on such a node, the same GPU a scan of all open GPUs in
// (load, index) order finds. The scan cost replicas x GPUs (minutes at 100,000 nodes); this costs
// replicas x GPUs per node x log GPUs.
LayerPlacement balanced_layout(const std::vector<int>& r, const std::vector<double>& loads, const Cluster& cluster,
                               bool prefer_new_node) {
  const int E = static_cast<int>(r.size());
  std::vector<int> reps;
  for (int e = 0; e < E; ++e)
    for (int i = 0; i < r[e]; ++i) reps.push_back(e);
  auto rload = [&](int e) { return loads[e] / r[e]; };
  std::stable_sort(reps.begin(), reps.end(), [&](int a, int b) { return rload(a) > rload(b); });
  const int D = cluster.gpus(), S = cluster.slots_per_gpu, G = cluster.gpus_per_node;
  std::vector<double> load(D, 0.0);
  std::vector<int> used(D, 0);
  std::vector<std::vector<int>> gslots(D);
  std::vector<std::vector<int>> nodes_of(E);  // nodes holding each expert, in order of placement
  std::vector<int> holds(cluster.nodes, -1);  // node -> `current` when it holds it (set for a run's expert)
  std::vector<char> where(D, 1);              // 0: full, 1: open, 2: blocked
  std::set<std::pair<double, int>> open, blocked;
  for (int g = 0; g < D; ++g) open.insert({0.0, g});
  int current = -1;
  auto block_node = [&](int n) {
    for (int g = n * G; g < (n + 1) * G; ++g)
      if (where[g] == 1) {
        open.erase({load[g], g});
        blocked.insert({load[g], g});
        where[g] = 2;
      }
  };
  auto unblock_all = [&] {
    for (const auto& k : blocked) {
      open.insert(k);
      where[k.second] = 1;
    }
    blocked.clear();
  };
  for (int e : reps) {
    if (e != current) {
      unblock_all();
      current = e;
      const bool block = prefer_new_node && static_cast<int>(nodes_of[e].size()) < cluster.nodes;
      for (int n : nodes_of[e]) {
        holds[n] = e;
        if (block) block_node(n);
      }
    }
    const bool blocking = prefer_new_node && static_cast<int>(nodes_of[e].size()) < cluster.nodes;
    auto& from = open.empty() ? blocked : open;
    const int g = from.begin()->second;
    from.erase(from.begin());
    where[g] = 0;
    gslots[g].push_back(e);
    load[g] += rload(e);
    const int n = cluster.node_of_gpu(g);
    if (holds[n] != e) {
      nodes_of[e].push_back(n);
      holds[n] = e;
      if (blocking && static_cast<int>(nodes_of[e].size()) < cluster.nodes) block_node(n);
    }
    const bool still_blocking = prefer_new_node && static_cast<int>(nodes_of[e].size()) < cluster.nodes;
    if (blocking && !still_blocking) unblock_all();
    if (++used[g] < S) {
      const bool aside = still_blocking && holds[n] == e;
      (aside ? blocked : open).insert({load[g], g});
      where[g] = aside ? 2 : 1;
    }
  }
  LayerPlacement out;
  out.phy2log.resize(cluster.slots());
  for (int g = 0; g < D; ++g)
    for (int s = 0; s < S; ++s) out.phy2log[g * S + s] = gslots[g][s];
  out.phyrank = ranks_by_appearance(out.phy2log, E);
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

const AlgorithmRegistrar kRegister("lazarus", [] { return std::make_unique<Lazarus>(); });

}  // namespace
}  // namespace ucpkit::placement
