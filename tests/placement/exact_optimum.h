// The exact optimum of the most loaded GPU over every placement meeting f (equal shares), by a
// search written for the tests (independent of lib/placement's own search): the truth the balance
// bound and the gap figures of the plan are checked against on small clusters.
#pragma once
#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "placement/cluster.h"

namespace placement_test {

// The same optimum by a search that scales to ~20 slots: every replica allocation r (r_e >= f, sum =
// slots), in increasing order of the lower bound max(mean, largest share + (S - 1) x smallest share)
// (a GPU holding the largest share holds S - 1 more), stopping once that bound reaches the best
// found; each allocation packed by depth-first search, largest share first, cutting a branch whose
// GPU would reach the best found, and choosing among interchangeable GPUs only once: an empty GPU
// only when no earlier empty GPU of its node is allowed, an empty node only when no earlier empty
// node is, and the replicas of one expert (identical) on nondecreasing GPU ids. Returns +inf when
// the search visits more than `budget` nodes (then the result is unknown).
inline double search_optimum(const std::vector<double>& t, const ucpkit::placement::Cluster& cl, int f, long long budget) {
  const int E = static_cast<int>(t.size()), n = cl.slots(), m = cl.gpus(), S = cl.slots_per_gpu,
            G = cl.gpus_per_node;
  const double mean = std::accumulate(t.begin(), t.end(), 0.0) / m;
  std::vector<std::vector<int>> allocs;
  std::vector<int> r(E, f);
  std::function<void(int, int)> gen = [&](int e, int left) {
    if (e == E - 1) {
      r[e] = f + left;
      allocs.push_back(r);
      return;
    }
    for (int x = 0; x <= left; ++x) {
      r[e] = f + x;
      gen(e + 1, left - x);
    }
  };
  if (f * E > n) return std::numeric_limits<double>::infinity();
  gen(0, n - f * E);
  auto lower = [&](const std::vector<int>& a) {
    double hi = 0, lo = std::numeric_limits<double>::infinity();
    for (int e = 0; e < E; ++e) {
      hi = std::max(hi, t[e] / a[e]);
      lo = std::min(lo, t[e] / a[e]);
    }
    return std::max(mean, hi + (S - 1) * lo);
  };
  std::vector<std::pair<double, int>> order;
  for (size_t i = 0; i < allocs.size(); ++i) order.push_back({lower(allocs[i]), static_cast<int>(i)});
  std::sort(order.begin(), order.end());
  double best = std::numeric_limits<double>::infinity();
  long long visited = 0;
  std::vector<double> load(m);
  std::vector<int> used(m), item, here(cl.nodes);
  std::vector<double> share;
  for (const auto& [lb, idx] : order) {
    if (lb >= best * (1 - 1e-12)) break;
    const auto& a = allocs[idx];
    item.clear();
    std::vector<int> ex(E);
    std::iota(ex.begin(), ex.end(), 0);
    std::sort(ex.begin(), ex.end(), [&](int x, int y) { return t[x] * a[y] > t[y] * a[x] || (t[x] * a[y] == t[y] * a[x] && x < y); });
    for (int e : ex)
      for (int k = 0; k < a[e]; ++k) item.push_back(e);
    std::fill(load.begin(), load.end(), 0.0);
    std::fill(used.begin(), used.end(), 0);
    std::vector<std::vector<int>> on(E, std::vector<int>(cl.nodes, 0));
    std::function<void(int, int, double)> dfs = [&](int i, int prev, double cur) {
      if (++visited > budget) return;
      if (i == n) {
        best = std::min(best, cur);
        return;
      }
      const int e = item[i];
      const double s = t[e] / a[e];
      const int start = i > 0 && item[i - 1] == e ? prev : 0;
      // replicas of e still to place, this one included, and the nodes e already sits on
      int left = 0;
      for (int j = i; j < n && item[j] == e; ++j) ++left;
      int nodes_on = 0;
      for (int v = 0; v < cl.nodes; ++v) nodes_on += on[e][v] > 0;
      if (nodes_on + left < f) return;
      for (int g = start; g < m; ++g) {
        if (used[g] == S) continue;
        const double after = std::max(cur, load[g] + s);
        if (after >= best * (1 - 1e-12)) continue;
        const int v = g / G;
        if (used[g] == 0) {
          bool earlier = false;
          for (int h = std::max(start, v * G); h < g && !earlier; ++h) earlier = used[h] == 0;
          if (earlier) continue;
          auto node_empty = [&](int w) {
            for (int h = w * G; h < (w + 1) * G; ++h)
              if (used[h]) return false;
            return true;
          };
          if (node_empty(v)) {
            for (int w = 0; w < v && !earlier; ++w) earlier = w * G >= start && node_empty(w);
            if (earlier) continue;
          }
        }
        used[g]++;
        load[g] += s;
        on[e][v]++;
        const bool last = left == 1;
        if (!last || nodes_on + (on[e][v] == 1) >= f) dfs(i + 1, g, after);
        on[e][v]--;
        load[g] -= s;
        used[g]--;
      }
    };
    dfs(0, 0, 0.0);
    if (visited > budget) return std::numeric_limits<double>::infinity();
  }
  return best;
}

}  // namespace placement_test
