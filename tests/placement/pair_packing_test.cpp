// Two slots per GPU (pair_packing.h): the sorted pairing against every pairing, enumerated here; the
// allocation search keeps the floor and the slot count; the layout is the pairing it claims.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "placement/balance.h"
#include "placement/pair_packing.h"

namespace pair_packing_test {

using namespace ucpkit::placement;

namespace {

// The lightest most loaded pair over every perfect matching of `items` (shares), by enumeration:
// the first unmatched item with each later one in turn.
double best_matching(std::vector<double> items) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<char> used(items.size(), 0);
  std::function<void(double)> go = [&](double cur) {
    size_t i = 0;
    while (i < items.size() && used[i]) ++i;
    if (i == items.size()) {
      best = std::min(best, cur);
      return;
    }
    used[i] = 1;
    for (size_t j = i + 1; j < items.size(); ++j) {
      if (used[j]) continue;
      used[j] = 1;
      go(std::max(cur, items[i] + items[j]));
      used[j] = 0;
    }
    used[i] = 0;
  };
  go(0);
  return best;
}

}  // namespace

TEST(PairPacking, SortedPairingIsTheLightestOfAllPairings) {
  std::mt19937 rng(3);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int E = 2 + static_cast<int>(rng() % 4);
    std::vector<int> r(E);
    std::vector<double> t(E);
    int n = 0;
    for (int e = 0; e < E; ++e) {
      r[e] = 1 + static_cast<int>(rng() % 3);
      t[e] = 1 + static_cast<double>(rng() % (trial % 2 ? 20 : 1000));
      n += r[e];
    }
    if (n % 2) r[0]++, n++;
    if (n > 12) continue;
    std::vector<double> items;
    for (int e = 0; e < E; ++e)
      for (int k = 0; k < r[e]; ++k) items.push_back(t[e] / r[e]);
    EXPECT_NEAR(sorted_pairing(r, t).max, best_matching(items), 1e-9 * best_matching(items));
    ++checked;
  }
  EXPECT_GT(checked, 150);
}

TEST(PairPacking, AllocationSearchKeepsTheFloorAndTheSlotsAndNeverPairsWorse) {
  std::mt19937 rng(11);
  std::lognormal_distribution<double> skew(8.0, 1.5);
  for (int trial = 0; trial < 40; ++trial) {
    const int E = 4 + static_cast<int>(rng() % 30), f = 1 + static_cast<int>(rng() % 3);
    std::vector<double> t(E);
    for (double& x : t) x = std::floor(skew(rng)) + 1;
    std::vector<int> r(E, f);
    for (int k = 0; k < E + 2 * static_cast<int>(rng() % 8); ++k) r[rng() % E]++;
    int n = 0;
    for (int x : r) n += x;
    if (n % 2) r[0]++, n++;
    const auto better = improve_pair_allocation(r, t, f, 400);
    int m = 0;
    for (int x : better) {
      EXPECT_GE(x, f);
      m += x;
    }
    EXPECT_EQ(m, n);
    EXPECT_LE(sorted_pairing(better, t).max, sorted_pairing(r, t).max * (1 + 1e-12));
  }
}

TEST(PairPacking, LayoutHoldsTheCountsAndItsMostLoadedGpuIsTheSortedPairing) {
  std::mt19937 rng(17);
  for (const Cluster& cl : {Cluster{4, 2, 2}, Cluster{8, 1, 2}, Cluster{3, 4, 2}}) {
    for (int trial = 0; trial < 10; ++trial) {
      const int E = 3 + static_cast<int>(rng() % 5);
      std::vector<double> t(E);
      for (double& x : t) x = 1 + static_cast<double>(rng() % 500);
      std::vector<int> r(E, 1);
      for (int k = E; k < cl.slots(); ++k) r[rng() % E]++;
      const auto p2l = sorted_pair_layout(r, t, cl);
      std::vector<int> got(E, 0);
      for (int e : p2l) {
        ASSERT_GE(e, 0);
        got[e]++;
      }
      EXPECT_EQ(got, r);
      const auto g = gpu_loads(p2l, t, cl);
      EXPECT_NEAR(*std::max_element(g.begin(), g.end()), sorted_pairing(r, t).max, 1e-9);
    }
  }
}

}  // namespace pair_packing_test
