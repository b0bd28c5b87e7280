// Swap chains (swap_chain.h): never a heavier most loaded GPU, counts and f kept; and the layer of
// the wider randomized set where a single swap cannot help, against an optimum proven by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "placement/balance.h"
#include "placement/balanced_ft.h"
#include "placement/lpt_fill.h"
#include "placement/swap_chain.h"
#include "random_workloads.h"

namespace swap_chain_test {

using namespace ucpkit::placement;
using namespace placement_test;

namespace {

std::vector<int> counts(const std::vector<int>& p2l, int E) {
  std::vector<int> r(E, 0);
  for (int e : p2l) r[e]++;
  return r;
}

}  // namespace

TEST(SwapChain, NeverHeavierKeepsCountsAndFaultTolerance) {
  int improved = 0, cases = 0;
  for_each_small_instance(
      23, {Cluster{4, 2, 4}, Cluster{5, 2, 4}, Cluster{8, 1, 3}, Cluster{3, 2, 3}, Cluster{6, 2, 2}}, 6,
      [](const Cluster& cl, int f, std::mt19937& rng) { return std::max(2, cl.slots() / f - static_cast<int>(rng() % 3)); },
      [&](const Cluster& cl, int f, const std::vector<double>& t, const std::vector<int>& r) {
        const int E = static_cast<int>(t.size());
        const auto start = lpt_pack(r, t, cl, true);
        const auto d0 = distinct_nodes(start, cl, E);
        const auto out = swap_chain_improve(start, t, cl, f, 64);
        EXPECT_EQ(counts(out, E), r);
        const auto d1 = distinct_nodes(out, cl, E);
        for (int e = 0; e < E; ++e) EXPECT_GE(d1[e], std::min(f, d0[e]));
        EXPECT_LE(most_loaded_gpu(out, t, cl), most_loaded_gpu(start, t, cl) * (1 + 1e-12));
        improved += most_loaded_gpu(out, t, cl) < most_loaded_gpu(start, t, cl) * (1 - 1e-12);
        ++cases;
      });
  std::printf("swap chains: %d of %d LPT packings lighter\n", improved, cases);
  EXPECT_GT(improved, 0);
}

TEST(SwapChain, ReachesTheProvenOptimumOnFiveByTwoByFour) {
  // The wider set's 5 x 2 x 4, f = 3, 13 skewed experts, layer 0 (40 slots, f * E = 39): the hot
  // expert (72,266 tokens) needs 4 replicas (3 would carry 24,089 each, above everything below), so
  // every other expert has exactly 3, one per node. 7 GPUs hold one hot replica (4 x 18,066.5 and
  // 3 x 18,252 for the second, 54,755), 3 GPUs none. The expert of 3,881 tokens (shares 3,881 / 3):
  // if a replica sits on a hot GPU, that GPU carries >= 18,066.5 + (3,881 + 941 + 1,177) / 3 (two
  // more replicas of two other experts, at least the two smallest) = 20,066.17; if all three sit on
  // the 3 other GPUs, those have 9 slots left for the 12 replicas of 18,119, 17,094, 7,212 and 6,701
  // tokens, so a hot GPU takes one (>= 6,701 / 3): >= 21,006.17. So no placement meeting f has a most
  // loaded GPU under 18,066.5 + 5,999 / 3 (balancedness 188,135 / 10 over it = 0.93757). LPT and
  // single swaps stopped at 0.8956 (issue 31); the chains reach it.
  bool seen = false;
  for_each_wider_case([&](const RandomCase& rc) {
    if (!(rc.cluster.nodes == 5 && rc.f == 3 && rc.shape == Shape::Skewed)) return;
    const auto t = rc.loads.layer_vector(0);
    std::vector<double> sorted = t;
    std::sort(sorted.rbegin(), sorted.rend());
    ASSERT_EQ(t.size(), 13u);
    ASSERT_EQ(sorted[0], 72266);  // the loads the argument above is about
    ASSERT_EQ(sorted[1], 54755);
    seen = true;
    const auto p = balanced_ft_layer(t, rc.cluster, 3).phy2log;
    const auto d = distinct_nodes(p, rc.cluster, 13);
    EXPECT_GE(*std::min_element(d.begin(), d.end()), 3);
    EXPECT_NEAR(most_loaded_gpu(p, t, rc.cluster), 18066.5 + 5999.0 / 3, 1e-6);
  });
  EXPECT_TRUE(seen);
}

}  // namespace swap_chain_test
