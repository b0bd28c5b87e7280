// Branch and bound for the lightest most loaded GPU on small clusters (see exact_search.h).
#include "placement/exact_search.h"

#include <algorithm>
#include <numeric>

namespace ucpkit::placement {

namespace {

// The packing of one allocation: replicas in order of decreasing share, each to a GPU with a free
// slot; a branch stops when its GPU would reach the best found. Interchangeable choices are tried
// once: replicas of one expert on nondecreasing GPUs, and among GPUs in the same state (same node
// contents so far being empty) only the first.
struct ExactPacker {
  const Cluster& cl;
  int f;
  std::vector<int> item;        // expert of every replica, in packing order
  std::vector<double> share;    // its share
  std::vector<int> left_after;  // replicas of the same expert after this one
  std::vector<double> load;
  std::vector<int> used, gpu_of;
  std::vector<std::vector<int>> on;  // [expert][node] replicas
  std::vector<int> nodes_of;         // distinct nodes per expert so far
  double best;
  long long steps = 0, max_steps;
  std::vector<int> best_gpu_of;

  bool node_empty(int v) const {
    for (int g = v * cl.gpus_per_node; g < (v + 1) * cl.gpus_per_node; ++g)
      if (used[g]) return false;
    return true;
  }

  void dfs(size_t i, double cur) {
    if (++steps > max_steps) return;
    if (i == item.size()) {
      best = cur;
      best_gpu_of = gpu_of;
      return;
    }
    const int e = item[i], G = cl.gpus_per_node, S = cl.slots_per_gpu;
    const int from = i > 0 && item[i - 1] == e ? gpu_of[i - 1] : 0;
    bool tried_empty_node = false;
    for (int g = from; g < cl.gpus(); ++g) {
      if (used[g] == S) continue;
      const double after = std::max(cur, load[g] + share[i]);
      if (after >= best * (1 - 1e-9)) continue;
      const int v = g / G;
      if (used[g] == 0) {  // one empty GPU per node, one empty node in all
        bool earlier = false;
        for (int h = std::max(from, v * G); h < g && !earlier; ++h) earlier = used[h] == 0;
        if (earlier) continue;
        if (node_empty(v)) {
          if (tried_empty_node) continue;
          tried_empty_node = true;
        }
      }
      const bool new_node = on[e][v] == 0;
      // e still needs f - nodes distinct nodes; the replicas after this one can add at most left_after
      if (nodes_of[e] + new_node + left_after[i] < f) continue;
      used[g]++, load[g] += share[i], on[e][v]++, nodes_of[e] += new_node, gpu_of[i] = g;
      dfs(i + 1, after);
      used[g]--, load[g] -= share[i], on[e][v]--, nodes_of[e] -= new_node;
      if (steps > max_steps) return;
    }
  }
};

// A lower bound on the most loaded GPU of any packing of allocation r: the mean, and the largest
// share beside the S - 1 smallest.
double allocation_bound(const std::vector<int>& r, const std::vector<double>& t, int gpus, int S) {
  std::vector<double> shares;
  double total = 0;
  for (size_t e = 0; e < r.size(); ++e) {
    total += t[e];
    for (int k = 0; k < r[e]; ++k) shares.push_back(t[e] / r[e]);
  }
  std::sort(shares.begin(), shares.end());
  double b = shares.back();
  for (int k = 0; k < S - 1 && k + 1 < static_cast<int>(shares.size()); ++k) b += shares[k];
  return std::max(total / gpus, b);
}

}  // namespace

std::optional<std::vector<int>> exact_lighter_placement(const std::vector<double>& t, const Cluster& cl, int f,
                                                        double incumbent, const ExactSearchLimits& limits) {
  const int E = static_cast<int>(t.size()), n = cl.slots();
  if (n > limits.max_slots || E == 0 || static_cast<long long>(f) * E > n || f > cl.nodes) return std::nullopt;
  // Allocations r_e >= f, sum n, whose bound is below the incumbent, lightest bound first.
  std::vector<std::pair<double, std::vector<int>>> allocs;
  std::vector<int> r(E, f);
  long long seen = 0;
  bool too_many = false;
  auto gen = [&](auto&& self, int e, int left) -> void {
    if (too_many) return;
    if (e == E - 1) {
      r[e] = f + left;
      if (++seen > 50 * limits.max_allocations) too_many = true;
      const double b = allocation_bound(r, t, cl.gpus(), cl.slots_per_gpu);
      if (b < incumbent * (1 - 1e-9)) allocs.push_back({b, r});
      if (static_cast<long long>(allocs.size()) > limits.max_allocations) too_many = true;
      return;
    }
    for (int x = 0; x <= left; ++x) {
      r[e] = f + x;
      self(self, e + 1, left - x);
    }
  };
  gen(gen, 0, n - f * E);
  if (too_many) return std::nullopt;
  std::sort(allocs.begin(), allocs.end());
  ExactPacker pk{cl, f};
  pk.best = incumbent;
  pk.max_steps = limits.max_steps;
  std::vector<int> best_item;
  for (const auto& [bound, a] : allocs) {
    if (bound >= pk.best * (1 - 1e-9)) break;
    std::vector<int> ex(E);
    std::iota(ex.begin(), ex.end(), 0);
    std::sort(ex.begin(), ex.end(),
              [&](int x, int y) { return t[x] / a[x] > t[y] / a[y] || (t[x] / a[x] == t[y] / a[y] && x < y); });
    pk.item.clear(), pk.share.clear(), pk.left_after.clear();
    for (int e : ex)
      for (int k = 0; k < a[e]; ++k) {
        pk.item.push_back(e);
        pk.share.push_back(t[e] / a[e]);
        pk.left_after.push_back(a[e] - 1 - k);
      }
    pk.load.assign(cl.gpus(), 0.0);
    pk.used.assign(cl.gpus(), 0);
    pk.gpu_of.assign(n, -1);
    pk.on.assign(E, std::vector<int>(cl.nodes, 0));
    pk.nodes_of.assign(E, 0);
    const double before = pk.best;
    pk.dfs(0, 0.0);
    if (pk.steps > pk.max_steps) return std::nullopt;  // unfinished: nothing claimed
    if (pk.best < before) best_item = pk.item;
  }
  if (best_item.empty()) return std::nullopt;
  std::vector<int> phy2log(n, -1), used(cl.gpus(), 0);
  for (size_t i = 0; i < best_item.size(); ++i) {
    const int g = pk.best_gpu_of[i];
    phy2log[g * cl.slots_per_gpu + used[g]++] = best_item[i];
  }
  return phy2log;
}

}  // namespace ucpkit::placement
