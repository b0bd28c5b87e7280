// MRO construction, degree repair and small-instance refinement.
#include "placement/mro.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <string>
#include <tuple>

#include "core/error.h"
#include "placement/recovery.h"

namespace ucpkit::placement {
namespace {

using Nodes = std::vector<std::vector<int>>;

int count_of(const std::vector<int>& v, int e) { return static_cast<int>(std::count(v.begin(), v.end(), e)); }

int distinct_nodes(const Nodes& nodes, int e) {
  int d = 0;
  for (const auto& n : nodes) d += std::find(n.begin(), n.end(), e) != n.end();
  return d;
}

void swap_replicas(Nodes& nodes, int x, int a, int y, int b) {
  *std::find(nodes[x].begin(), nodes[x].end(), a) = b;
  *std::find(nodes[y].begin(), nodes[y].end(), b) = a;
}

// Raises every expert to min(f, r_e, N) distinct nodes: move a doubled replica of e from node x to a
// node y lacking e, in exchange for an expert b of y that x lacks (b keeps its distinct-node count).
void repair_degrees(Nodes& nodes, const std::vector<int>& r, const std::vector<int>& order, int f) {
  const int N = static_cast<int>(nodes.size());
  std::vector<int> degree(r.size(), 0);
  for (const auto& n : nodes) {
    std::vector<int> u = n;
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    for (int e : u) degree[e]++;
  }
  bool short_of_f = false;
  for (int e : order) short_of_f = short_of_f || degree[e] < std::min({f, r[e], N});
  if (!short_of_f) return;
  for (bool changed = true; changed;) {
    changed = false;
    for (int e : order) {
      int need = std::min({f, r[e], N});
      if (distinct_nodes(nodes, e) >= need) continue;
      for (int x = 0; x < N && !changed; ++x) {
        if (count_of(nodes[x], e) < 2) continue;
        for (int y = 0; y < N && !changed; ++y) {
          if (count_of(nodes[y], e) > 0) continue;
          int best = -1;
          for (int b : nodes[y])
            if (count_of(nodes[x], b) == 0 && (best < 0 || r[b] > r[best])) best = b;
          if (best < 0) continue;
          swap_replicas(nodes, x, e, y, best);
          changed = true;
        }
      }
    }
  }
}

bool lex_greater(const std::vector<double>& a, const std::vector<double>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] > b[i] + 1e-12) return true;
    if (a[i] < b[i] - 1e-12) return false;
  }
  return false;
}

// First-improvement local search over replica swaps between two nodes.
void refine(Nodes& nodes, int experts) {
  const int N = static_cast<int>(nodes.size());
  std::vector<double> best = exact_recovery_vector(nodes, experts);
  for (bool improved = true; improved;) {
    improved = false;
    for (int x = 0; x < N && !improved; ++x)
      for (int y = x + 1; y < N && !improved; ++y) {
        std::vector<int> ax = nodes[x], by = nodes[y];
        std::sort(ax.begin(), ax.end());
        ax.erase(std::unique(ax.begin(), ax.end()), ax.end());
        std::sort(by.begin(), by.end());
        by.erase(std::unique(by.begin(), by.end()), by.end());
        for (int a : ax) {
          for (int b : by) {
            if (a == b) continue;
            swap_replicas(nodes, x, a, y, b);
            auto v = exact_recovery_vector(nodes, experts);
            if (lex_greater(v, best)) {
              best = v;
              improved = true;
              break;
            }
            swap_replicas(nodes, x, b, y, a);
          }
          if (improved) break;
        }
      }
  }
}

// Exhaustive search over node-level placements of a small cluster (N <= 6, so a set of failed nodes
// is a bit of one 64-bit word). Nodes are unlabeled: each node holds a non-decreasing sequence of
// experts and successive nodes non-decreasing sequences (lexicographically), so every placement is
// visited once up to node relabeling. Objective: the lexicographically largest vector
// (p(1), ..., p(N-1)), then the smallest maximum node load (replica load = t_e / r_e). On every
// instance with N <= 6, E <= 6, c <= 3 one placement is best for every k at once (checked over all
// 561 sorted allocations), so the lexicographic best is the per-k best there. Gives up (returns
// false) after `step_cap` search steps.
class Exhaustive {
 public:
  Exhaustive(const std::vector<int>& r, const std::vector<double>& loads, int N, int c, long long step_cap)
      : N_(N), c_(c), E_(static_cast<int>(r.size())), cap_(step_cap), left_(r), cur_(N, std::vector<int>(c)) {
    const uint32_t full = (1u << N) - 1;
    for (uint32_t m = 0; m <= full; ++m) {
      sup_[m] = 0;
      for (uint32_t f = 0; f <= full; ++f)
        if ((f & m) == m) sup_[m] |= uint64_t{1} << f;
    }
    for (int k = 0; k <= N; ++k) {
      layer_[k] = 0;
      for (uint32_t f = 0; f <= full; ++f)
        if (std::popcount(f) == k) layer_[k] |= uint64_t{1} << f;
    }
    for (int e = 0; e < E_; ++e) rload_.push_back(r[e] ? loads[e] / r[e] : 0.0);
  }

  bool run(Nodes& out) {
    descend(0, 0, false);
    if (aborted_ || best_.empty()) return false;
    out = best_;
    return true;
  }

 private:
  void descend(int n, int s, bool tight) {
    if (aborted_ || ++steps_ > cap_) {
      aborted_ = true;
      return;
    }
    if (n == N_) return leaf();
    if (s == c_) return descend(n + 1, 0, n + 1 < N_);
    int lo = s > 0 ? cur_[n][s - 1] : 0;
    if (tight) lo = std::max(lo, cur_[n - 1][s]);
    for (int e = lo; e < E_; ++e) {
      if (left_[e] == 0) continue;
      left_[e]--;
      cur_[n][s] = e;
      descend(n, s + 1, tight && e == cur_[n - 1][s]);
      left_[e]++;
      if (aborted_) return;
    }
  }

  void leaf() {
    uint32_t mask[64] = {};
    for (int n = 0; n < N_; ++n)
      for (int e : cur_[n]) mask[e] |= 1u << n;
    uint64_t bad = 0;  // failure sets that lose some expert
    for (int e = 0; e < E_; ++e) bad |= sup_[mask[e]];
    std::vector<int> lost(N_);
    for (int k = 1; k < N_; ++k) lost[k - 1] = std::popcount(bad & layer_[k]);
    double peak = 0;
    for (int n = 0; n < N_; ++n) {
      double l = 0;
      for (int e : cur_[n]) l += rload_[e];
      peak = std::max(peak, l);
    }
    if (!best_.empty()) {
      if (lost > best_lost_) return;
      if (lost == best_lost_ && peak >= best_peak_ - 1e-12) return;
    }
    best_lost_ = std::move(lost);
    best_peak_ = peak;
    best_ = cur_;
  }

  int N_, c_, E_;
  long long cap_, steps_ = 0;
  bool aborted_ = false;
  std::vector<int> left_;
  Nodes cur_, best_;
  std::vector<int> best_lost_;
  double best_peak_ = 0;
  std::vector<double> rload_;
  uint64_t sup_[64], layer_[7];
};

}  // namespace

std::vector<double> exact_recovery_vector(const Nodes& nodes, int experts) {
  const int N = static_cast<int>(nodes.size());
  if (N > 24) throw Error("internal: exact recovery vector needs at most 24 nodes");
  std::vector<uint32_t> mask(experts, 0);
  for (int n = 0; n < N; ++n)
    for (int e : nodes[n]) mask[e] |= 1u << n;
  std::vector<double> ok(N + 1, 0), total(N + 1, 0);
  const uint32_t all = N == 32 ? ~0u : ((1u << N) - 1);
  for (uint32_t alive = 0; alive <= all; ++alive) {
    int k = N - std::popcount(alive);
    total[k] += 1;
    bool good = true;
    for (int e = 0; e < experts && good; ++e) good = (mask[e] & alive) != 0;
    ok[k] += good;
  }
  std::vector<double> p;
  for (int k = 1; k < N; ++k) p.push_back(ok[k] / total[k]);
  return p;
}

namespace {

// The nodes with room, ordered by (load, -room, node): the first is the least loaded, with the most
// room among equal loads, then the lowest index.
using NodeQueue = std::set<std::tuple<double, int, int>>;

// The node the leftover scan picks among `q` (see place_leftovers). Nodes whose load is more than
// 1e-12 above every load of the lowest band T (T: the least load, then every next distinct load
// within 1e-12 of T's largest) can neither replace a T node in the scan nor stay picked once a T node
// is seen, so only T matters. When T holds one load value the scan ends on T's node with the most
// room, lowest index first: `q`'s first. Otherwise (near ties from rounding) T is scanned in node order.
int pick_node(const NodeQueue& q, const std::vector<double>& node_load, const std::vector<int>& room) {
  constexpr int kMax = std::numeric_limits<int>::max();
  const auto first = q.begin();
  double top = std::get<0>(*first);
  auto it = q.upper_bound({top, kMax, kMax});
  bool one_value = true;
  while (it != q.end()) {
    const double f = std::get<0>(*it);
    if (f > top + 1e-12 && top < f - 1e-12) break;
    one_value = false;
    top = f;
    it = q.upper_bound({f, kMax, kMax});
  }
  if (one_value) return std::get<2>(*first);
  std::vector<int> band;
  for (auto j = first; j != it; ++j) band.push_back(std::get<2>(*j));
  std::sort(band.begin(), band.end());
  int best = -1;
  for (int n : band)
    if (best < 0 || node_load[n] < node_load[best] - 1e-12 ||
        (node_load[n] <= node_load[best] + 1e-12 && room[n] > room[best]))
      best = n;
  return best;
}

}  // namespace

void place_leftovers(std::vector<std::vector<int>>& nodes, const std::vector<int>& pending,
                     const std::vector<double>& replica_load, int slots_per_node) {
  const int N = static_cast<int>(nodes.size()), E = static_cast<int>(replica_load.size());
  std::vector<double> node_load(N, 0.0);
  std::vector<int> room(N);
  std::vector<std::vector<char>> present(N, std::vector<char>(E, 0));
  std::vector<std::vector<int>> nodes_of(E);  // nodes holding each expert
  for (int n = 0; n < N; ++n) {
    for (int e : nodes[n]) {
      node_load[n] += replica_load[e];
      if (!present[n][e]) nodes_of[e].push_back(n);
      present[n][e] = 1;
    }
    room[n] = slots_per_node - static_cast<int>(nodes[n].size());
  }
  // The nodes with room, split for the current expert: `lacking` it and `holding` it. A pick takes
  // from `lacking` unless it is empty; switching experts moves the nodes of the old and the new one.
  NodeQueue lacking, holding;
  auto key = [&](int n) { return std::make_tuple(node_load[n], -room[n], n); };
  for (int n = 0; n < N; ++n)
    if (room[n] > 0) lacking.insert(key(n));
  int current = -1;
  auto move_nodes = [&](int e, NodeQueue& from, NodeQueue& to) {
    for (int n : nodes_of[e])
      if (room[n] > 0 && from.erase(key(n))) to.insert(key(n));
  };
  for (int e : pending) {
    if (e != current) {
      if (current >= 0) move_nodes(current, holding, lacking);
      current = e;
      move_nodes(e, lacking, holding);
    }
    NodeQueue& q = lacking.empty() ? holding : lacking;
    const int best = pick_node(q, node_load, room);
    q.erase(key(best));
    nodes[best].push_back(e);
    node_load[best] += replica_load[e];
    --room[best];
    if (!present[best][e]) nodes_of[e].push_back(best);
    present[best][e] = 1;
    if (room[best] > 0) holding.insert(key(best));
  }
}

std::vector<std::vector<int>> mro_placement(const std::vector<int>& r, const std::vector<double>& loads, int N, int c,
                                            const MroOptions& options) {
  const int E = static_cast<int>(r.size());
  long long total = std::accumulate(r.begin(), r.end(), 0LL);
  if (total != 1LL * N * c)
    throw Error("internal: " + std::to_string(total) + " replicas for " + std::to_string(1LL * N * c) + " slots");
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    if (r[a] != r[b]) return r[a] < r[b];
    return loads[a] < loads[b];
  });

  Nodes nodes(N);
  std::vector<int> left = r;
  int offset = 0;
  for (int start = 0; start < E; start += c) {
    int end = std::min(E, start + c);
    bool last = end == E;
    int avail = N - offset;
    if (avail <= 0) break;  // leftovers below place whatever did not fit
    if (!last) {
      int block = std::min(r[order[start]], avail);
      for (int n = offset; n < offset + block; ++n)
        for (int i = start; i < end; ++i) {
          nodes[n].push_back(order[i]);
          left[order[i]]--;
        }
      offset += block;
    } else {
      for (int i = start; i < end; ++i) {
        int e = order[i];
        for (int n = offset; n < offset + std::min(r[e], avail); ++n) {
          nodes[n].push_back(e);
          left[e]--;
        }
      }
    }
  }

  // Leftover replicas, heaviest replica first, onto the least loaded node with room that lacks them.
  auto rload = [&](int e) { return r[e] ? loads[e] / r[e] : 0.0; };
  std::vector<int> pending;
  for (int e : order)
    for (int i = 0; i < left[e]; ++i) pending.push_back(e);
  std::stable_sort(pending.begin(), pending.end(), [&](int a, int b) { return rload(a) > rload(b); });
  std::vector<double> replica_load(E);
  for (int e = 0; e < E; ++e) replica_load[e] = rload(e);
  place_leftovers(nodes, pending, replica_load, c);

  repair_degrees(nodes, r, order, options.fault_tolerance);

  if (N >= 2 && N <= 6 && E <= 64 && binomial(E + c - 1, c) <= options.exhaustive_node_choices) {
    Nodes best;
    if (Exhaustive(r, loads, N, c, options.exhaustive_steps).run(best)) return best;
  }
  if (N <= 16 && N >= 2) {
    double swaps = 0.5 * N * (N - 1) * static_cast<double>(c) * c;
    double cost = swaps * std::ldexp(1.0, N) * E;
    if (cost <= options.refine_budget) refine(nodes, E);
  }
  return nodes;
}

}  // namespace ucpkit::placement
