// MRO placement versus brute force over every placement of the same allocation: every instance shape
// with N <= 6 nodes, E <= 6 experts, c <= 3 slots per node, p(k) compared for every k = 1..N-1.
#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "placement/allocation.h"
#include "placement/mro.h"
#include "placement/planner.h"

namespace mro_test {

using namespace ucpkit::placement;

namespace {

using Nodes = std::vector<std::vector<int>>;

// Recovery probability for every k (index k, k = 0..N), straight from the definition: for every set
// of failed nodes, does every expert still have a replica on a live node?
std::vector<double> brute_recovery(const Nodes& nodes, int experts) {
  const int N = static_cast<int>(nodes.size());
  std::vector<double> good(N + 1, 0), total(N + 1, 0);
  std::vector<unsigned> where(experts, 0);
  for (int n = 0; n < N; ++n)
    for (int e : nodes[n]) where[e] |= 1u << n;
  for (unsigned failed = 0; failed < (1u << N); ++failed) {
    int k = __builtin_popcount(failed);
    bool all = true;
    for (int e = 0; e < experts; ++e) all = all && (where[e] & ~failed) != 0;
    total[k] += 1;
    good[k] += all;
  }
  for (int k = 0; k <= N; ++k) good[k] /= total[k];
  return good;
}

// Best recovery probability per k over all placements of replica counts r on N nodes of c slots:
// nodes are unlabeled, so each node takes a multiset (non-decreasing expert ids) and successive
// nodes take non-decreasing multisets (by index in the list of multisets). The best depends only on
// the sorted counts, so results are cached.
std::vector<double> brute_best(std::vector<int> r, int N, int c) {
  std::sort(r.begin(), r.end());
  static std::map<std::vector<int>, std::vector<double>> cache;
  std::vector<int> key = r;
  key.push_back(N);
  key.push_back(c);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const int E = static_cast<int>(r.size());
  std::vector<std::vector<int>> multisets;
  std::vector<int> cur;
  std::function<void(int)> gen = [&](int from) {
    if (static_cast<int>(cur.size()) == c) {
      multisets.push_back(cur);
      return;
    }
    for (int e = from; e < E; ++e) {
      cur.push_back(e);
      gen(e);
      cur.pop_back();
    }
  };
  gen(0);
  std::vector<double> best(N + 1, -1.0);
  Nodes nodes;
  std::vector<int> left = r;
  std::function<void(size_t)> place = [&](size_t min_index) {
    if (static_cast<int>(nodes.size()) == N) {
      std::vector<double> p = brute_recovery(nodes, E);
      for (int k = 1; k < N; ++k) best[k] = std::max(best[k], p[k]);
      return;
    }
    for (size_t i = min_index; i < multisets.size(); ++i) {
      bool ok = true;
      for (int e : multisets[i])
        if (--left[e] < 0) ok = false;
      if (ok) {
        nodes.push_back(multisets[i]);
        place(i);
        nodes.pop_back();
      }
      for (int e : multisets[i]) ++left[e];
    }
  };
  place(0);
  return cache[key] = best;
}

std::string describe(const std::vector<int>& r, int N, int c) {
  std::string s = "N=" + std::to_string(N) + " c=" + std::to_string(c) + " r=";
  for (int x : r) s += std::to_string(x) + " ";
  return s;
}

// Node-level placement `nodes` of counts r reaches the brute-force best for every k.
void expect_best(const Nodes& nodes, const std::vector<int>& r, int N, int c, const std::string& what) {
  std::vector<double> best = brute_best(r, N, c);
  std::vector<double> got = brute_recovery(nodes, static_cast<int>(r.size()));
  for (int k = 1; k < N; ++k)
    EXPECT_NEAR(got[k], best[k], 1e-12) << what << " " << describe(r, N, c) << "k=" << k;
}

void expect_optimal(const std::vector<int>& r, const std::vector<double>& loads, int N, int c, int f) {
  MroOptions o;
  o.fault_tolerance = f;
  Nodes nodes = mro_placement(r, loads, N, c, o);
  ASSERT_EQ(static_cast<int>(nodes.size()), N);
  std::vector<int> count(r.size(), 0);
  for (const auto& n : nodes) {
    ASSERT_EQ(static_cast<int>(n.size()), c);
    for (int e : n) count[e]++;
  }
  ASSERT_EQ(count, r) << describe(r, N, c);
  expect_best(nodes, r, N, c, "mro");
}

// Every allocation r_1 <= ... <= r_E, r_e >= 1, sum N*c.
void for_each_sorted_allocation(int E, int total, const std::function<void(const std::vector<int>&)>& fn) {
  std::vector<int> r;
  std::function<void(int, int)> part = [&](int lo, int rem) {
    if (static_cast<int>(r.size()) == E - 1) {
      if (rem >= lo) {
        r.push_back(rem);
        fn(r);
        r.pop_back();
      }
      return;
    }
    for (int x = lo; x * (E - static_cast<int>(r.size())) <= rem; ++x) {
      r.push_back(x);
      part(x, rem - x);
      r.pop_back();
    }
  };
  part(1, total);
}

}  // namespace

TEST(Mro, PaperExampleNestedSets) {
  // E <= c: the least replicated expert spans its r nodes, the others contain them (nested).
  std::vector<int> r = {1, 2, 3, 4};
  Nodes nodes = mro_placement(r, {1, 2, 3, 4}, 5, 2);
  EXPECT_NEAR(brute_recovery(nodes, 4)[1], 4.0 / 5.0, 1e-12);
}

TEST(Mro, RepairsLastGroupThatRunsOutOfNodes) {
  // The paper's construction puts both replicas of the third expert on one node here.
  expect_optimal({2, 2, 2}, {1, 1, 1}, 3, 2, 2);
}

TEST(Mro, AuditCounterexamples) {
  // 5 equal experts x 3 replicas on 5 nodes x 3 slots: three distinct nodes each gives p(2) = 1
  // (the construction alone doubled a replica on one node: p(2) = 0.9).
  expect_optimal({3, 3, 3, 3, 3}, {10, 10, 10, 10, 10}, 5, 3, 1);
  Nodes nodes = mro_placement({3, 3, 3, 3, 3}, {10, 10, 10, 10, 10}, 5, 3);
  EXPECT_EQ(brute_recovery(nodes, 5)[2], 1.0);
  // r = (5,5,4,4) on 6 nodes x 3 slots: optimum p(4) = 13/15 (the construction gave 0.8).
  expect_optimal({5, 5, 4, 4}, {5, 5, 4, 4}, 6, 3, 1);
  expect_optimal({1, 7, 10}, {10, 50, 60}, 6, 3, 1);
}

TEST(Mro, MatchesBruteForceOnEverySortedAllocation) {
  // Every N <= 6, c <= 3, E <= min(6, N*c) and every allocation up to relabeling (561 instances).
  int checked = 0;
  for (int N = 1; N <= 6; ++N)
    for (int c = 1; c <= 3; ++c)
      for (int E = 1; E <= std::min(6, N * c); ++E)
        for_each_sorted_allocation(E, N * c, [&](const std::vector<int>& r) {
          std::vector<double> loads(r.begin(), r.end());
          expect_optimal(r, loads, N, c, 1);
          ++checked;
        });
  EXPECT_EQ(checked, 561 + 6);  // 6 more with N = 1 (nothing to compare there)
}

TEST(Mro, MatchesBruteForceOnRandomSmallInstances) {
  // Random allocations in random expert order with unrelated loads, several per shape.
  std::mt19937 rng(7);
  int checked = 0;
  for (int N = 2; N <= 6; ++N)
    for (int c = 1; c <= 3; ++c)
      for (int E = 1; E <= std::min(6, N * c); ++E)
        for (int trial = 0; trial < 3; ++trial) {
          std::vector<int> r(E, 1);
          for (int i = E; i < N * c; ++i) r[rng() % E]++;
          std::vector<double> loads(E);
          for (auto& t : loads) t = static_cast<double>(rng() % 1000);
          int f = 1 + static_cast<int>(rng() % 3);
          f = std::min({f, N, *std::min_element(r.begin(), r.end())});
          expect_optimal(r, loads, N, c, f);
          ++checked;
        }
  EXPECT_GT(checked, 200);
}

TEST(Mro, MatchesBruteForceOnLazarusAllocations) {
  std::mt19937 rng(11);
  int checked = 0;
  for (int N = 2; N <= 6; ++N)
    for (int c = 1; c <= 3; ++c)
      for (int E = 1; E <= std::min(6, N * c); ++E)
        for (int f = 1; f <= 3; ++f) {
          if (f > N || f * E > N * c) continue;
          std::vector<double> loads(E);
          for (auto& t : loads) t = static_cast<double>(rng() % 1000);
          std::vector<int> r = lazarus_allocation(loads, N, c, f);
          expect_optimal(r, loads, N, c, f);
          ++checked;
        }
  EXPECT_GT(checked, 100);
}

TEST(Mro, LazarusPlannerKeepsTheOptimumForEveryK) {
  // The planner may swap in a balance-driven layout; on small clusters it must stay optimal for
  // every k = 1..N-1, not only k <= --max-failures (r = (1,7,10) on 6 x 3: p(5) = 1/6, not 0).
  struct Case {
    Cluster cluster;
    std::vector<double> loads;
    int f;
  };
  std::vector<Case> cases = {{{6, 1, 3}, {10, 50, 60}, 1}, {{5, 1, 3}, {10, 10, 10, 10, 10}, 1},
                             {{6, 3, 1}, {10, 50, 60}, 1}, {{6, 1, 3}, {5, 5, 4, 4}, 1}};
  std::mt19937 rng(5);
  for (int N = 2; N <= 6; ++N)
    for (int c = 1; c <= 3; ++c)
      for (int E = 1; E <= std::min(6, N * c); ++E) {
        std::vector<double> loads(E);
        for (auto& t : loads) t = static_cast<double>(1 + rng() % 1000);
        int f = E * 2 <= N * c && N >= 2 ? 2 : 1;
        int G = rng() % 2 ? c : 1;  // c GPUs x 1 slot or 1 GPU x c slots
        cases.push_back({{N, G, c / G}, loads, f});
      }
  for (const auto& cs : cases) {
    LoadMatrix w;
    w.layers = 1;
    w.experts = cs.loads.size();
    w.values = cs.loads;
    PlacementOptions o;
    o.fault_tolerance = cs.f;
    o.recovery.max_failures = 2;  // fewer than N - 1: the layout choice must still look at every k
    Plan p = plan_placement(w, cs.cluster, "lazarus", o);
    const int c = cs.cluster.slots_per_node(), E = static_cast<int>(cs.loads.size());
    Nodes nodes(cs.cluster.nodes);
    for (size_t s = 0; s < p.layers[0].phy2log.size(); ++s) nodes[s / c].push_back(p.layers[0].phy2log[s]);
    expect_best(nodes, logical_counts(p.layers[0].phy2log, E), cs.cluster.nodes, c, "lazarus");
  }
}

TEST(Mro, LargerInstancesKeepFDistinctNodes) {
  std::mt19937 rng(3);
  std::vector<double> loads(64);
  for (auto& t : loads) t = 1 + rng() % 5000;
  std::vector<int> r = lazarus_allocation(loads, 16, 16, 2);
  MroOptions o;
  o.fault_tolerance = 2;
  Nodes nodes = mro_placement(r, loads, 16, 16, o);
  for (int e = 0; e < 64; ++e) {
    int d = 0;
    for (const auto& n : nodes) d += std::count(n.begin(), n.end(), e) > 0;
    EXPECT_GE(d, 2) << "expert " << e;
  }
}

namespace {

// The leftover pass as it was written before it used ordered sets (a scan of every node per replica):
// the rule place_leftovers() must reproduce node for node, epsilon ties included.
void leftovers_by_scan(Nodes& nodes, const std::vector<int>& pending, const std::vector<double>& rload, int c) {
  const int N = static_cast<int>(nodes.size()), E = static_cast<int>(rload.size());
  std::vector<double> node_load(N, 0.0);
  std::vector<std::vector<char>> present(N, std::vector<char>(E, 0));
  for (int n = 0; n < N; ++n)
    for (int e : nodes[n]) {
      node_load[n] += rload[e];
      present[n][e] = 1;
    }
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
    node_load[best] += rload[e];
  }
}

}  // namespace

// Random partial placements whose node loads tie exactly (equal contents), nearly (0.1 + 0.2 against
// 0.3; steps of 3e-13, so chains of loads each within 1e-12 of the next) or not at all, with pending
// replicas grouped by expert (as mro_placement orders them) or shuffled: the same nodes as the scan.
TEST(Mro, LeftoverPassPicksTheNodesOfTheScan) {
  std::mt19937 rng(16);
  const std::vector<std::vector<double>> palettes = {
      {0.1, 0.2, 0.3, 1.0 / 3, 2.0 / 3, 0.7, 1.0, 0.0},
      {1.0, 1.0 + 3e-13, 1.0 + 6e-13, 1.0 + 9e-13, 1.0 + 1.2e-12, 2.0, 3e-13},
      {5.0, 5.0, 5.0, 5.0},
      {1.0, 2.0, 4.0, 8.0, 16.0, 32.0}};
  int cases = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int N = 1 + static_cast<int>(rng() % 40), c = 1 + static_cast<int>(rng() % 6);
    const int E = 1 + static_cast<int>(rng() % 8);
    const auto& palette = palettes[rng() % palettes.size()];
    std::vector<double> rload(E);
    for (auto& x : rload) x = palette[rng() % palette.size()];
    Nodes nodes(N);
    int free_slots = 0;
    for (auto& n : nodes) {
      const int fill = static_cast<int>(rng() % (c + 1));
      for (int i = 0; i < fill; ++i) n.push_back(static_cast<int>(rng() % E));
      free_slots += c - fill;
    }
    std::vector<int> pending;
    const int count = free_slots == 0 ? 0 : static_cast<int>(rng() % (free_slots + 1));
    for (int i = 0; i < count; ++i) pending.push_back(static_cast<int>(rng() % E));
    if (rng() % 2) std::sort(pending.begin(), pending.end());
    Nodes expected = nodes, got = nodes;
    leftovers_by_scan(expected, pending, rload, c);
    place_leftovers(got, pending, rload, c);
    ASSERT_EQ(got, expected) << "trial " << trial << ": N " << N << " c " << c << " E " << E;
    cases += !pending.empty();
  }
  EXPECT_GT(cases, 2500);
}

// The leftover pass is no longer replicas x nodes: 40,000 nodes x 16 slots (a Lazarus allocation of 64
// experts, a few hundred thousand leftover replicas) take about 0.1 s of CPU; the scan of every node per
// replica took 4 s. CPU time of this process (std::clock), so other load on the machine does not count.
TEST(Mro, LeftoverPassOnManyNodes) {
  const int N = 40000, c = 16, E = 64;
  std::mt19937 rng(7);
  std::vector<double> loads(E);
  for (auto& t : loads) t = 1 + rng() % 1000;
  std::vector<int> r = lazarus_allocation(loads, N, c, 1);
  const std::clock_t start = std::clock();
  const Nodes nodes = mro_placement(r, loads, N, c);
  EXPECT_LT(static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC, 1.5);
  std::vector<int> placed(E, 0);
  for (const auto& n : nodes) {
    ASSERT_EQ(static_cast<int>(n.size()), c);
    for (int e : n) placed[e]++;
  }
  EXPECT_EQ(placed, r);
}

}  // namespace mro_test
