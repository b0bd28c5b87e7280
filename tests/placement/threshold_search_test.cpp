// The threshold search (threshold_search.h) and the pair-allocation restarts (pair_packing.h):
// never a heavier most loaded GPU, f and every slot kept; and on the wider randomized set's layers
// where balanced-ft stopped short of eplb-global (issue 31), EPLB's balance reached under f.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "placement/balance.h"
#include "placement/balanced_ft.h"
#include "placement/eplb.h"
#include "placement/layer_state.h"
#include "placement/lpt_fill.h"
#include "placement/pair_packing.h"
#include "placement/threshold_search.h"
#include "random_workloads.h"

namespace threshold_search_test {

using namespace ucpkit::placement;
using namespace placement_test;

namespace {

// The most loaded pair of the sorted pairing, computed here from the shares (not by the library).
double pairing_max(const std::vector<int>& r, const std::vector<double>& t) {
  std::vector<double> s;
  for (size_t e = 0; e < r.size(); ++e)
    for (int k = 0; k < r[e]; ++k) s.push_back(t[e] / r[e]);
  std::sort(s.begin(), s.end());
  double m = 0;
  for (size_t i = 0; i < s.size() / 2; ++i) m = std::max(m, s[i] + s[s.size() - 1 - i]);
  return m;
}

}  // namespace

TEST(ThresholdSearch, NeverHeavierKeepsTheFloorAndEverySlot) {
  int lighter = 0, cases = 0;
  for_each_small_instance(
      31, {Cluster{4, 2, 4}, Cluster{5, 2, 4}, Cluster{8, 1, 3}, Cluster{6, 2, 2}, Cluster{16, 4, 4}}, 4,
      [](const Cluster& cl, int f, std::mt19937& rng) { return std::max(2, cl.slots() / (f + 1 + static_cast<int>(rng() % 3))); },
      [&](const Cluster& cl, int f, const std::vector<double>& t, const std::vector<int>& r) {
        const int E = static_cast<int>(t.size());
        LayerState st(cl, t, lpt_pack(r, t, cl, true));
        repair_fault_tolerance(st, f);
        const auto start = st.phy2log();
        const auto d0 = distinct_nodes(start, cl, E);
        const double mean = std::accumulate(t.begin(), t.end(), 0.0) / cl.gpus();
        ThresholdSearchLimits lim;
        lim.iterations = 20000;
        // The mean: rarely reachable, so every attempt runs.
        const auto out = threshold_search(start, t, cl, f, mean, lim);
        ASSERT_EQ(out.size(), start.size());
        std::vector<int> c(E, 0);
        for (int e : out) {
          ASSERT_GE(e, 0);
          ASSERT_LT(e, E);
          c[e]++;
        }
        const auto d1 = distinct_nodes(out, cl, E);
        for (int e = 0; e < E; ++e) {
          EXPECT_GE(c[e], std::min(f, r[e]));
          EXPECT_GE(d1[e], std::min(f, d0[e]));
        }
        EXPECT_LE(most_loaded_gpu(out, t, cl), most_loaded_gpu(start, t, cl) * (1 + 1e-12));
        lighter += most_loaded_gpu(out, t, cl) < most_loaded_gpu(start, t, cl) * (1 - 1e-12);
        ++cases;
      });
  std::printf("threshold search: %d of %d packings lighter\n", lighter, cases);
  EXPECT_GT(lighter, cases / 2);
}

TEST(ThresholdSearch, BalancedFtReachesEplbGlobalOnTheWiderSetLayersItMissed) {
  // The wider set's 128 x 8 x 4 skewed (f = 2, 3) and log-normal (f = 3) layers and its 5 x 2 x 4
  // log-normal f = 3 layer 1: eplb-global gives some expert fewer than f replicas; balanced-ft
  // stopped 0.2-2.6% below it before the threshold search. Now within 0.5% of it, f met.
  int checked = 0;
  for_each_wider_case([&](const RandomCase& rc) {
    const Cluster& cl = rc.cluster;
    const bool big = cl.nodes == 128 && cl.gpus_per_node == 8 &&
                     ((rc.shape == Shape::Skewed && rc.f >= 2) || (rc.shape == Shape::LogNormal && rc.f == 3));
    const bool small = cl.nodes == 5 && rc.shape == Shape::LogNormal && rc.f == 3;
    if (!big && !small) return;
    const auto ref = eplb_rebalance(rc.loads, cl, 1, true);
    for (size_t l = small ? 1 : 0; l < rc.loads.layers; ++l) {
      const auto t = rc.loads.layer_vector(l);
      const int E = static_cast<int>(t.size());
      BalancedFtLayerInfo info;
      const auto p = balanced_ft_layer(t, cl, rc.f, &info).phy2log;
      const auto d = distinct_nodes(p, cl, E);
      EXPECT_GE(*std::min_element(d.begin(), d.end()), rc.f);
      const auto c = logical_counts(ref[l].phy2log, E);
      EXPECT_LT(*std::min_element(c.begin(), c.end()), rc.f);  // eplb-global itself does not meet f
      EXPECT_GE(balancedness(p, t, cl), balancedness(ref[l].phy2log, t, cl) * 0.995) << cl.describe() << " layer " << l;
      EXPECT_TRUE(info.threshold_search);
      ++checked;
    }
  });
  EXPECT_EQ(checked, 7);
}

TEST(PairPacking, RestartsKeepTheFloorAndTheSlotsAndNeverPairWorse) {
  std::mt19937 rng(41);
  std::lognormal_distribution<double> skew(6.0, 1.0);
  int lighter = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int E = 4 + static_cast<int>(rng() % 20), f = 1 + static_cast<int>(rng() % 3);
    std::vector<double> t(E);
    for (double& x : t) x = std::floor(skew(rng)) + 1;
    std::vector<int> r(E, f);
    for (int k = 0; k < E + 2 * static_cast<int>(rng() % 8); ++k) r[rng() % E]++;
    if (std::accumulate(r.begin(), r.end(), 0) % 2) r[0]++;
    const auto start = improve_pair_allocation(r, t, f, 4 * E + 64);
    const auto out = restart_pair_allocation(start, t, f, 4 * E + 64, 16);
    EXPECT_EQ(std::accumulate(out.begin(), out.end(), 0), std::accumulate(r.begin(), r.end(), 0));
    for (int x : out) EXPECT_GE(x, f);
    EXPECT_LE(pairing_max(out, t), pairing_max(start, t) * (1 + 1e-12));
    lighter += pairing_max(out, t) < pairing_max(start, t) * (1 - 1e-12);
  }
  std::printf("pair restarts: %d of 40 lighter than the single local search\n", lighter);
  EXPECT_GT(lighter, 0);
}

TEST(PairPacking, RestartsReachEplbGlobalOnTwentyFourByTwoByTwo) {
  // The wider set's 24 x 2 x 2, f = 3, 19 log-normal experts, layer 1: the single local search over
  // allocations stopped at 0.9743, 0.56% below eplb-global's 0.9798 (which gives some expert fewer
  // than 3 replicas); the restarts find an allocation whose sorted pairing, laid out on the nodes,
  // meets f and balances better than eplb-global.
  bool seen = false;
  for_each_wider_case([&](const RandomCase& rc) {
    if (!(rc.cluster.nodes == 24 && rc.f == 3 && rc.shape == Shape::LogNormal)) return;
    seen = true;
    const Cluster& cl = rc.cluster;
    const auto t = rc.loads.layer_vector(1);
    const int E = static_cast<int>(t.size());
    const double eplb = balancedness(eplb_rebalance(rc.loads, cl, 1, true)[1].phy2log, t, cl);
    const auto p = balanced_ft_layer(t, cl, 3).phy2log;
    const auto d = distinct_nodes(p, cl, E);
    EXPECT_GE(*std::min_element(d.begin(), d.end()), 3);
    EXPECT_GE(balancedness(p, t, cl), eplb * 0.995);
    EXPECT_GE(balancedness(p, t, cl), 0.98);
  });
  EXPECT_TRUE(seen);
}

}  // namespace threshold_search_test
