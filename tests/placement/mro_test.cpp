// MRO placement versus brute force over every placement of the same allocation (small instances).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <random>

#include "placement/allocation.h"
#include "placement/mro.h"

using namespace ucpkit::placement;

namespace {

using Nodes = std::vector<std::vector<int>>;

// Recovery probability for k failed nodes, straight from the definition: every k-subset of failed
// nodes, does every expert still have a replica on a live node?
double brute_recovery(const Nodes& nodes, int experts, int k) {
  const int N = static_cast<int>(nodes.size());
  int good = 0, total = 0;
  for (int mask = 0; mask < (1 << N); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    ++total;
    std::vector<bool> alive(experts, false);
    for (int n = 0; n < N; ++n)
      if (!(mask >> n & 1))
        for (int e : nodes[n]) alive[e] = true;
    good += std::all_of(alive.begin(), alive.end(), [](bool b) { return b; });
  }
  return static_cast<double>(good) / total;
}

// Best recovery probability per k over all placements: nodes are unlabeled, so each node takes a
// multiset (non-decreasing expert ids) and successive nodes take non-increasing multisets.
std::vector<double> brute_best(const std::vector<int>& r, int N, int c) {
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
  std::vector<double> best(N, -1.0);
  Nodes nodes;
  std::vector<int> left = r;
  std::function<void(size_t)> place = [&](size_t min_index) {
    if (static_cast<int>(nodes.size()) == N) {
      for (int k = 1; k < N; ++k) best[k] = std::max(best[k], brute_recovery(nodes, E, k));
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
  return best;
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
  ASSERT_EQ(count, r);
  std::vector<double> best = brute_best(r, N, c);
  for (int k = 1; k < N; ++k) {
    std::string where = "N=" + std::to_string(N) + " c=" + std::to_string(c) + " k=" + std::to_string(k) + " r=";
    for (int x : r) where += std::to_string(x) + " ";
    EXPECT_NEAR(brute_recovery(nodes, static_cast<int>(r.size()), k), best[k], 1e-12) << where;
  }
}

}  // namespace

TEST(Mro, PaperExampleNestedSets) {
  // E <= c: the least replicated expert spans its r nodes, the others contain them (nested).
  std::vector<int> r = {1, 2, 3, 4};
  Nodes nodes = mro_placement(r, {1, 2, 3, 4}, 5, 2);
  EXPECT_NEAR(brute_recovery(nodes, 4, 1), 4.0 / 5.0, 1e-12);
}

TEST(Mro, RepairsLastGroupThatRunsOutOfNodes) {
  // The paper's construction puts both replicas of the third expert on one node here.
  expect_optimal({2, 2, 2}, {1, 1, 1}, 3, 2, 2);
}

TEST(Mro, MatchesBruteForceOnRandomSmallInstances) {
  std::mt19937 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 120; ++trial) {
    int N = 2 + static_cast<int>(rng() % 5);  // 2..6
    int c = 1 + static_cast<int>(rng() % 3);  // 1..3
    int E = 1 + static_cast<int>(rng() % std::min(6, N * c));
    // Keep the brute force quick: at most 12 slots.
    if (N * c > 12) continue;
    std::vector<int> r(E, 1);
    for (int i = E; i < N * c; ++i) r[rng() % E]++;
    std::vector<double> loads(E);
    for (int e = 0; e < E; ++e) loads[e] = r[e] + 0.1 * e;
    expect_optimal(r, loads, N, c, 1);
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

TEST(Mro, MatchesBruteForceOnLazarusAllocations) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    int N = 2 + static_cast<int>(rng() % 5);
    int c = 1 + static_cast<int>(rng() % 3);
    if (N * c > 12) continue;
    int E = 1 + static_cast<int>(rng() % std::min(6, N * c));
    int f = 1 + static_cast<int>(rng() % 2);
    if (f > N || f * E > N * c) f = 1;
    std::vector<double> loads(E);
    for (auto& t : loads) t = static_cast<double>(rng() % 1000);
    std::vector<int> r = lazarus_allocation(loads, N, c, f);
    expect_optimal(r, loads, N, c, f);
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
