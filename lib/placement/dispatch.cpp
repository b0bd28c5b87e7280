// Token dispatch plan: max-flow (Dinic) from experts to GPUs with GPU capacity T, T raised to the
// min cut's ratio until every token is routed.
#include "placement/dispatch.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/error.h"

namespace ucpkit::placement {
namespace {

class MaxFlow {
 public:
  explicit MaxFlow(int n) : head_(n, -1), level_(n), it_(n) {}
  int add_edge(int u, int v, double cap) {
    to_.push_back(v), cap_.push_back(cap), next_.push_back(head_[u]), head_[u] = static_cast<int>(to_.size()) - 1;
    to_.push_back(u), cap_.push_back(0), next_.push_back(head_[v]), head_[v] = static_cast<int>(to_.size()) - 1;
    return static_cast<int>(to_.size()) - 2;
  }
  void set_cap(int e, double cap) { cap_[e] = cap, cap_[e ^ 1] = 0; }
  double flow_on(int e) const { return cap_[e ^ 1]; }
  double run(int s, int t, double eps) {
    eps_ = eps;
    double total = 0;
    while (bfs(s, t)) {
      it_ = head_;
      while (double f = dfs(s, t, std::numeric_limits<double>::infinity())) total += f;
    }
    return total;
  }
  // Nodes reachable from s in the residual graph (after run): the source side of a min cut.
  std::vector<char> source_side(int s) const {
    std::vector<char> seen(head_.size(), 0);
    std::vector<int> stack{s};
    seen[s] = 1;
    while (!stack.empty()) {
      int u = stack.back();
      stack.pop_back();
      for (int e = head_[u]; e != -1; e = next_[e])
        if (cap_[e] > eps_ && !seen[to_[e]]) seen[to_[e]] = 1, stack.push_back(to_[e]);
    }
    return seen;
  }

 private:
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> q{s};
    level_[s] = 0;
    for (size_t i = 0; i < q.size(); ++i)
      for (int e = head_[q[i]]; e != -1; e = next_[e])
        if (cap_[e] > eps_ && level_[to_[e]] < 0) level_[to_[e]] = level_[q[i]] + 1, q.push_back(to_[e]);
    return level_[t] >= 0;
  }
  double dfs(int u, int t, double f) {
    if (u == t) return f;
    for (int& e = it_[u]; e != -1; e = next_[e]) {
      int v = to_[e];
      if (cap_[e] > eps_ && level_[v] == level_[u] + 1) {
        double d = dfs(v, t, std::min(f, cap_[e]));
        if (d > 0) {
          cap_[e] -= d, cap_[e ^ 1] += d;
          return d;
        }
      }
    }
    return 0;
  }
  std::vector<int> head_, level_, it_, to_, next_;
  std::vector<double> cap_;
  double eps_ = 0;
};

}  // namespace

DispatchPlan dispatch_plan(const std::vector<int>& phy2log, const std::vector<double>& loads, const Cluster& cl) {
  const int gpus = cl.gpus(), S = cl.slots_per_gpu, E = static_cast<int>(loads.size());
  if (static_cast<long long>(phy2log.size()) != static_cast<long long>(gpus) * S)
    throw Error("dispatch plan: phy2log has " + std::to_string(phy2log.size()) + " slots, the cluster " +
                std::to_string(static_cast<long long>(gpus) * S));
  DispatchPlan out;
  out.share.assign(phy2log.size(), 0.0);
  out.gpu_loads.assign(gpus, 0.0);
  std::vector<int> replicas(E, 0);
  for (int e : phy2log) {
    if (e < 0 || e >= E)
      throw Error("dispatch plan: slot holds expert " + std::to_string(e) + " of " + std::to_string(E));
    ++replicas[e];
  }
  double total = 0;
  for (int e = 0; e < E; ++e) {
    if (loads[e] > 0 && replicas[e] == 0)
      throw Error("dispatch plan: expert " + std::to_string(e) + " has tokens but no replica");
    total += loads[e];
  }
  // (gpu, expert) -> slots of that expert on that GPU.
  struct Pair {
    int gpu, expert, count, edge;
  };
  std::vector<Pair> pairs;
  std::map<std::pair<int, int>, size_t> index;
  for (size_t p = 0; p < phy2log.size(); ++p) {
    int g = static_cast<int>(p) / S, e = phy2log[p];
    auto [it, fresh] = index.emplace(std::make_pair(g, e), pairs.size());
    if (fresh) pairs.push_back({g, e, 0, -1});
    ++pairs[it->second].count;
  }
  const int src = E + gpus, sink = src + 1;
  MaxFlow mf(sink + 1);
  for (int e = 0; e < E; ++e)
    if (loads[e] > 0) mf.add_edge(src, e, loads[e]);
  for (auto& pr : pairs)
    if (loads[pr.expert] > 0) pr.edge = mf.add_edge(pr.expert, E + pr.gpu, std::numeric_limits<double>::infinity());
  std::vector<int> gpu_edge(gpus);
  double T = total / gpus;  // lower bound: the mean
  for (int g = 0; g < gpus; ++g) gpu_edge[g] = mf.add_edge(E + g, sink, T);
  const double eps = std::max(total, 1.0) * 1e-13;
  for (int iter = 0; total > 0; ++iter) {
    double f = mf.run(src, sink, eps);
    if (f >= total - std::max(total, 1.0) * 1e-10 || iter >= 64) break;
    // The min cut: experts A on the source side and their GPUs N(A); T* >= t(A) / |N(A)| > T.
    auto side = mf.source_side(src);
    double tA = 0;
    int nA = 0;
    for (int e = 0; e < E; ++e)
      if (side[e] && loads[e] > 0) tA += loads[e];
    for (int g = 0; g < gpus; ++g) nA += side[E + g] ? 1 : 0;
    double next = nA > 0 ? tA / nA : T;
    if (!(next > T * (1 + 1e-12))) next = T * (1 + 1e-9);  // rounding: nudge
    T = next;
    for (int g = 0; g < gpus; ++g) mf.set_cap(gpu_edge[g], T);
    for (const auto& pr : pairs)
      if (pr.edge >= 0) mf.set_cap(pr.edge, std::numeric_limits<double>::infinity());
    for (int e = 0, k = 0; e < E; ++e)
      if (loads[e] > 0) mf.set_cap(2 * k++, loads[e]);  // source edges were added first
  }
  // Shares: the flow on (expert, GPU) split evenly over that GPU's slots of the expert; experts
  // without tokens keep equal shares. Rounding residue is renormalized per expert.
  std::vector<double> routed(E, 0.0);
  for (const auto& pr : pairs)
    if (pr.edge >= 0) routed[pr.expert] += mf.flow_on(pr.edge);
  std::vector<double> pair_share(pairs.size(), 0.0);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto& pr = pairs[i];
    pair_share[i] = (pr.edge >= 0 && routed[pr.expert] > 0) ? mf.flow_on(pr.edge) / routed[pr.expert]
                                                            : static_cast<double>(pr.count) / replicas[pr.expert];
  }
  for (size_t p = 0; p < phy2log.size(); ++p) {
    size_t i = index.at({static_cast<int>(p) / S, phy2log[p]});
    out.share[p] = pair_share[i] / pairs[i].count;
    out.gpu_loads[p / S] += out.share[p] * loads[phy2log[p]];
  }
  double mx = 0;
  for (double x : out.gpu_loads) mx = std::max(mx, x);
  out.max_load = mx;
  out.mean_load = total / gpus;
  out.balancedness = mx > 0 ? out.mean_load / mx : 1.0;
  return out;
}

}  // namespace ucpkit::placement
