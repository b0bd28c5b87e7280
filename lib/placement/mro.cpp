// MRO construction, degree repair and small-instance refinement.
#include "placement/mro.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>

#include "core/error.h"

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
  std::vector<double> node_load(N, 0.0);
  std::vector<std::vector<char>> present(N, std::vector<char>(E, 0));
  auto rload = [&](int e) { return r[e] ? loads[e] / r[e] : 0.0; };
  for (int n = 0; n < N; ++n)
    for (int e : nodes[n]) {
      node_load[n] += rload(e);
      present[n][e] = 1;
    }
  std::vector<int> pending;
  for (int e : order)
    for (int i = 0; i < left[e]; ++i) pending.push_back(e);
  std::stable_sort(pending.begin(), pending.end(), [&](int a, int b) { return rload(a) > rload(b); });
  for (int e : pending) {
    int best = -1;
    bool best_lacks = false;
    int best_room = 0;
    for (int n = 0; n < N; ++n) {
      int room = c - static_cast<int>(nodes[n].size());
      if (room <= 0) continue;
      bool lacks = !present[n][e];
      if (best < 0 || (lacks && !best_lacks) ||
          (lacks == best_lacks && (node_load[n] < node_load[best] - 1e-12 ||
                                   (node_load[n] <= node_load[best] + 1e-12 && room > best_room)))) {
        best = n;
        best_lacks = lacks;
        best_room = room;
      }
    }
    nodes[best].push_back(e);
    present[best][e] = 1;
    node_load[best] += rload(e);
  }

  repair_degrees(nodes, r, order, options.fault_tolerance);

  if (N <= 16 && N >= 2) {
    double swaps = 0.5 * N * (N - 1) * static_cast<double>(c) * c;
    double cost = swaps * std::ldexp(1.0, N) * E;
    if (cost <= options.refine_budget) refine(nodes, E);
  }
  return nodes;
}

}  // namespace ucpkit::placement
