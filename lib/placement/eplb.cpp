// eplb and eplb-global: DeepSeek EPLB's replication and balanced packing.
#include "placement/eplb.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>

#include "core/error.h"
#include "placement/algorithm.h"

namespace ucpkit::placement {
namespace {

struct Packing {
  std::vector<int> pack, rank;  // per item
};

// Items heaviest first (stable on ties) into the lightest pack that is not full (lowest index on ties).
Packing balanced_packing(const std::vector<float>& w, int packs) {
  const int n = static_cast<int>(w.size());
  const int per = n / packs;
  Packing out{std::vector<int>(n), std::vector<int>(n)};
  if (per == 1) {
    std::iota(out.pack.begin(), out.pack.end(), 0);
    std::fill(out.rank.begin(), out.rank.end(), 0);
    return out;
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  // The packs that are not full in a heap by (weight, index): the same choice as scanning every pack
  // for the first lightest, in O(log packs) per item instead of O(packs).
  std::vector<float> pw(packs, 0.0f);
  std::vector<int> items(packs, 0);
  using Open = std::pair<float, int>;
  std::priority_queue<Open, std::vector<Open>, std::greater<Open>> open;
  for (int p = 0; p < packs; ++p) open.push({0.0f, p});
  for (int i : order) {
    const int best = open.top().second;
    open.pop();
    out.pack[i] = best;
    out.rank[i] = items[best]++;
    pw[best] += w[i];
    if (items[best] < per) open.push({pw[best], best});
  }
  return out;
}

struct Replication {
  std::vector<int> phy2log, rank, count;
};

// Adds replicas one at a time to the expert with the largest load per replica (first on ties).
Replication replicate(const std::vector<float>& w, int num_phy) {
  const int n = static_cast<int>(w.size());
  Replication out;
  out.phy2log.resize(num_phy);
  out.rank.assign(num_phy, 0);
  out.count.assign(n, 1);
  std::iota(out.phy2log.begin(), out.phy2log.begin() + n, 0);
  // Experts in a heap by (load per replica, lowest index first on ties): the same choice as scanning
  // every expert for the first largest, in O(log n) per replica.
  auto later = [](const std::pair<float, int>& a, const std::pair<float, int>& b) {
    return a.first < b.first || (a.first == b.first && a.second > b.second);
  };
  std::priority_queue<std::pair<float, int>, std::vector<std::pair<float, int>>, decltype(later)> heap(later);
  for (int e = 0; e < n; ++e) heap.push({w[e], e});  // count 1: w[e] / 1.0f == w[e]
  for (int i = n; i < num_phy; ++i) {
    const int best = heap.top().second;
    heap.pop();
    out.phy2log[i] = best;
    out.rank[i] = out.count[best]++;
    heap.push({w[best] / static_cast<float>(out.count[best]), best});
  }
  return out;
}

LayerPlacement hierarchical(const std::vector<float>& weight, int num_phy, int groups, int nodes, int gpus) {
  const int E = static_cast<int>(weight.size());
  const int group_size = E / groups, groups_per_node = groups / nodes;
  const int per_gpu = num_phy / gpus, log_per_node = E / nodes, phy_per_node = num_phy / nodes;
  const int gpus_per_node = gpus / nodes;

  // 1. Expert groups onto nodes by total group load.
  std::vector<float> group_load(groups, 0.0f);
  for (int g = 0; g < groups; ++g)
    for (int i = 0; i < group_size; ++i) group_load[g] += weight[g * group_size + i];
  Packing gp = balanced_packing(group_load, nodes);
  std::vector<int> log2mlog(E), mlog2log(E);
  for (int e = 0; e < E; ++e) {
    int g = e / group_size;
    log2mlog[e] = (gp.pack[g] * groups_per_node + gp.rank[g]) * group_size + e % group_size;
    mlog2log[log2mlog[e]] = e;
  }

  LayerPlacement out;
  out.phy2log.assign(num_phy, -1);
  out.phyrank.assign(num_phy, 0);
  for (int node = 0; node < nodes; ++node) {
    // 2. Replicas within the node.
    std::vector<float> w(log_per_node);
    for (int i = 0; i < log_per_node; ++i) w[i] = weight[mlog2log[node * log_per_node + i]];
    Replication rep = replicate(w, phy_per_node);
    // 3. The node's physical replicas onto its GPUs.
    std::vector<float> per_phy(phy_per_node);
    for (int p = 0; p < phy_per_node; ++p)
      per_phy[p] = w[rep.phy2log[p]] / static_cast<float>(rep.count[rep.phy2log[p]]);
    Packing pp = balanced_packing(per_phy, gpus_per_node);
    for (int p = 0; p < phy_per_node; ++p) {
      int slot = node * phy_per_node + pp.pack[p] * per_gpu + pp.rank[p];
      out.phy2log[slot] = mlog2log[node * log_per_node + rep.phy2log[p]];
      out.phyrank[slot] = rep.rank[p];
    }
  }
  return out;
}

class Eplb : public PlacementAlgorithm {
 public:
  explicit Eplb(bool global) : global_(global) {}
  std::string name() const override { return global_ ? "eplb-global" : "eplb"; }
  std::string description() const override {
    return global_ ? "DeepSeek EPLB, global policy" : "DeepSeek EPLB, hierarchical when groups divide by nodes";
  }
  PlacementResult place(const LoadMatrix& loads, const Cluster& cluster, const PlacementOptions& opt) const override {
    PlacementResult res;
    res.layers = eplb_rebalance(loads, cluster, opt.groups, global_);
    bool hier = !global_ && opt.groups % cluster.nodes == 0;
    res.details["eplb_policy"] = hier ? "hierarchical" : "global";
    res.details["groups"] = opt.groups;
    return res;
  }

 private:
  bool global_;
};

const AlgorithmRegistrar kEplb("eplb", [] { return std::make_unique<Eplb>(false); });
const AlgorithmRegistrar kEplbGlobal("eplb-global", [] { return std::make_unique<Eplb>(true); });

}  // namespace

std::vector<LayerPlacement> eplb_rebalance(const LoadMatrix& loads, const Cluster& cluster, int groups,
                                           bool force_global) {
  check_fits(loads, cluster);
  const int E = static_cast<int>(loads.experts);
  if (groups < 1) throw UsageError("--groups must be positive");
  bool hier = !force_global && groups % cluster.nodes == 0;
  if (hier && E % groups != 0)
    throw UsageError("--groups " + std::to_string(groups) + " does not divide " + std::to_string(E) + " experts");
  if (hier && cluster.slots_per_node() < E / cluster.nodes)
    throw UsageError("hierarchical EPLB needs at least " + std::to_string(E / cluster.nodes) + " slots per node");
  std::vector<LayerPlacement> out;
  for (size_t l = 0; l < loads.layers; ++l) {
    std::vector<float> w(E);
    for (int e = 0; e < E; ++e) w[e] = static_cast<float>(loads.at(l, e));
    out.push_back(hier ? hierarchical(w, cluster.slots(), groups, cluster.nodes, cluster.gpus())
                       : hierarchical(w, cluster.slots(), 1, 1, cluster.gpus()));
  }
  return out;
}

}  // namespace ucpkit::placement
