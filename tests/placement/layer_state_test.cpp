// LayerState and the local searches on it (lib/placement/layer_state.cpp): counts, shares, loads and
// node spread on small layers checked by hand, kept current by swaps and rewrites; the order of the
// GPUs by (load, id) against sorting them all; best_swap, best_rewrite, reduce_max,
// repair_fault_tolerance and overlap_node_sets on layers whose best move is worked out by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "placement/layer_state.h"
#include "support/errors.h"

namespace layer_state_test {

using namespace ucpkit::placement;

// 2 nodes x 1 GPU x 2 slots; expert 0 (load 6) twice on GPU 0, expert 1 (2) and expert 2 (4) on GPU 1.
TEST(LayerState, CountsSharesLoadsAndNodesOfTheInitialLayer) {
  const Cluster cl{2, 1, 2};
  LayerState st(cl, {6, 2, 4, 1}, {0, 0, 1, 2});  // expert 3 has no replica
  EXPECT_EQ(st.experts(), 4);
  EXPECT_EQ(st.count(0), 2);
  EXPECT_EQ(st.count(3), 0);
  EXPECT_EQ(st.share(0), 3.0);
  EXPECT_EQ(st.share(1), 2.0);
  EXPECT_EQ(st.share(2), 4.0);
  EXPECT_EQ(st.share(3), 0.0);  // no replica: no share (not a division by zero)
  EXPECT_EQ(st.expert_load(2), 4.0);
  EXPECT_EQ(st.gpu_loads(), (std::vector<double>{6, 6}));
  EXPECT_EQ(st.distinct(0), 1);
  EXPECT_EQ(st.distinct(3), 0);
  EXPECT_EQ(st.on_node(0, 0), 2);
  EXPECT_EQ(st.on_node(0, 1), 0);
  EXPECT_EQ(st.slots_of(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(st.slots_of(2), (std::vector<int>{3}));
  // Equal loads: the most loaded is the larger id.
  EXPECT_EQ(st.argmax_gpu(), 1);
  EXPECT_EQ(st.max_load(), 6.0);
  // Moving one of expert 0's two node-0 replicas to node 1 adds a node; removing one loses none.
  EXPECT_EQ(st.distinct_after_move(0, 0, 1), 2);
  EXPECT_EQ(st.distinct_after_move(0, 0, 0), 1);
  EXPECT_EQ(st.distinct_after_remove(0, 0), 1);
  EXPECT_EQ(st.distinct_after_remove(2, 1), 0);
  EXPECT_EQ(st.distinct_after_move(2, 1, 0), 1);
}

TEST(LayerState, RefusesAPlacementOfTheWrongSize) {
  const std::string msg = ucpkit::testing::error_of([] { LayerState(Cluster{2, 1, 2}, {1, 1}, {0, 1, 0}); });
  EXPECT_NE(msg.find("wrong size"), std::string::npos) << msg;
}

TEST(LayerState, SwapMovesLoadsNodesAndSlotListsOfBothExperts) {
  const Cluster cl{2, 1, 2};
  LayerState st(cl, {6, 2, 4}, {0, 0, 1, 2});
  const auto v0 = st.version(0), v1 = st.version(1), v2 = st.version(2);
  st.swap_slots(1, 2);  // {0, 1 | 0, 2}
  EXPECT_EQ(st.phy2log(), (std::vector<int>{0, 1, 0, 2}));
  EXPECT_EQ(st.gpu_loads(), (std::vector<double>{3 + 2, 3 + 4}));
  EXPECT_EQ(st.count(0), 2);  // counts and shares do not change
  EXPECT_EQ(st.share(0), 3.0);
  EXPECT_EQ(st.distinct(0), 2);
  EXPECT_EQ(st.on_node(1, 0), 1);
  EXPECT_EQ(st.on_node(1, 1), 0);
  EXPECT_EQ(st.slots_of(0), (std::vector<int>{0, 2}));  // slot 2 takes slot 1's place in the list
  EXPECT_EQ(st.slots_of(1), (std::vector<int>{1}));
  EXPECT_EQ(st.argmax_gpu(), 1);
  EXPECT_EQ(st.max_load(), 7.0);
  EXPECT_NE(st.version(0), v0);
  EXPECT_NE(st.version(1), v1);
  EXPECT_EQ(st.version(2), v2);
  // Two slots of one expert: nothing changes, not even the stamps.
  const auto v0b = st.version(0);
  st.swap_slots(0, 2);
  EXPECT_EQ(st.phy2log(), (std::vector<int>{0, 1, 0, 2}));
  EXPECT_EQ(st.version(0), v0b);
}

TEST(LayerState, RewriteChangesCountsSharesAndEveryHolderLoad) {
  const Cluster cl{2, 1, 2};
  LayerState st(cl, {6, 2, 4}, {0, 1, 0, 2});
  st.set_slot(0, 2);  // expert 0: 2 -> 1 replica (share 6); expert 2: 1 -> 2 (share 2)
  EXPECT_EQ(st.phy2log(), (std::vector<int>{2, 1, 0, 2}));
  EXPECT_EQ(st.count(0), 1);
  EXPECT_EQ(st.count(2), 2);
  EXPECT_EQ(st.share(0), 6.0);
  EXPECT_EQ(st.share(2), 2.0);
  EXPECT_EQ(st.gpu_loads(), (std::vector<double>{2 + 2, 6 + 2}));
  EXPECT_EQ(st.slots_of(0), (std::vector<int>{2}));
  EXPECT_EQ(st.slots_of(2), (std::vector<int>{3, 0}));
  EXPECT_EQ(st.distinct(0), 1);
  EXPECT_EQ(st.distinct(2), 2);
  EXPECT_EQ(st.argmax_gpu(), 1);
  EXPECT_EQ(st.max_load(), 8.0);
  // The last replica rewritten away: share 0, no node, no slots.
  st.set_slot(2, 1);
  EXPECT_EQ(st.count(0), 0);
  EXPECT_EQ(st.share(0), 0.0);
  EXPECT_EQ(st.distinct(0), 0);
  EXPECT_TRUE(st.slots_of(0).empty());
  EXPECT_EQ(st.share(1), 1.0);
  EXPECT_EQ(st.gpu_loads(), (std::vector<double>{2 + 1, 1 + 2}));
}

// An expert with many replicas (a batched rewrite): every holder's load changes by the new share.
TEST(LayerState, RewriteOfAnExpertWithManyReplicasUpdatesEveryGpu) {
  const Cluster cl{2, 8, 1};  // 16 GPUs, one slot each
  std::vector<int> phy(16, 0);
  phy[15] = 1;
  LayerState st(cl, {150, 7}, phy);  // expert 0: 15 replicas of 10
  st.set_slot(15, 0);                // 16 replicas of 9.375; expert 1 gone
  for (int g = 0; g < 16; ++g) EXPECT_EQ(st.load(g), 150.0 / 16) << g;
  EXPECT_EQ(st.argmax_gpu(), 15);
  st.set_slot(3, 1);  // back: 15 of 10 and GPU 3 holds expert 1 alone
  EXPECT_EQ(st.load(3), 7.0);
  EXPECT_EQ(st.load(0), 10.0);
  EXPECT_EQ(st.argmax_gpu(), 15);
  std::vector<int> light;
  st.lightest(2, light);
  EXPECT_EQ(light, (std::vector<int>{3, 0}));
}

TEST(LayerState, LightestWalksTheGpusByLoadThenId) {
  const Cluster cl{1, 4, 1};
  LayerState st(cl, {2, 1, 2, 0.5}, {0, 1, 2, 3});
  std::vector<int> light;
  st.lightest(10, light);  // fewer GPUs than asked
  EXPECT_EQ(light, (std::vector<int>{3, 1, 0, 2}));
  st.lightest(0, light);
  EXPECT_TRUE(light.empty());
  LayerState::Lightest it(st);
  EXPECT_EQ(it.next(), 3);
  EXPECT_EQ(it.next(), 1);
  EXPECT_EQ(it.next(), 0);
  EXPECT_EQ(it.next(), 2);
  EXPECT_EQ(it.next(), -1);
}

// Past the 64 kept in order, the iterator sorts the others: 100 GPUs with loads 99, 98, ..., 0.
TEST(LayerState, LightestGoesPastTheSixtyFourKeptInOrder) {
  const Cluster cl{10, 10, 1};
  std::vector<double> t(100);
  std::vector<int> phy(100);
  for (int g = 0; g < 100; ++g) t[g] = 99 - g, phy[g] = g;
  LayerState st(cl, t, phy);
  LayerState::Lightest it(st);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(it.next(), 99 - i) << i;
  EXPECT_EQ(it.next(), -1);
  EXPECT_EQ(st.argmax_gpu(), 0);
}

TEST(LayerState, CopiesAreIndependentAndShareStampsUntilTheyChange) {
  const Cluster cl{2, 1, 2};
  LayerState a(cl, {6, 2, 4}, {0, 0, 1, 2});
  LayerState b = a;
  EXPECT_EQ(b.version(0), a.version(0));
  b.swap_slots(1, 2);
  EXPECT_EQ(a.phy2log(), (std::vector<int>{0, 0, 1, 2}));
  EXPECT_EQ(a.gpu_loads(), (std::vector<double>{6, 6}));
  EXPECT_NE(b.version(0), a.version(0));
  EXPECT_EQ(b.version(2), a.version(2));
}

// Moved from replace_test.cpp. LayerState keeps the lightest GPUs by (load, id) in a sorted list and
// a lazy min-heap (entries bound their loads and are put right at the top), the most loaded per block
// of 64 GPUs and of all: after every swap and rewrite (single ones and the batched ones of experts
// with many replicas) the most loaded GPU and the k lightest, past the 64 kept in order too, are those
// of sorting all GPUs by (load, id), also where the last block is partly filled (65 and 325 GPUs).
TEST(LayerState, OrderEqualsSortingTheGpus) {
  std::mt19937 rng(5);
  for (const Cluster cl : {Cluster{1, 1, 3}, Cluster{2, 2, 2}, Cluster{4, 4, 4}, Cluster{13, 5, 2}, Cluster{16, 8, 4},
                           Cluster{40, 8, 2}, Cluster{25, 13, 2}}) {
    const int experts = std::max(2, cl.slots() / 3);
    std::vector<double> t(experts);
    for (double& x : t) x = static_cast<double>(rng() % 7);  // small integers: many equal loads
    std::vector<int> phy(cl.slots());
    for (int p = 0; p < cl.slots(); ++p)
      phy[p] = p < experts ? p : static_cast<int>(rng() % std::min(3, experts));  // hot experts 0-2
    std::shuffle(phy.begin(), phy.end(), rng);
    LayerState st(cl, t, phy);
    std::vector<int> light;
    for (int step = 0; step < 300; ++step) {
      const int p = static_cast<int>(rng() % cl.slots()), q = static_cast<int>(rng() % cl.slots());
      if (step % 3 == 0) {
        const int e = static_cast<int>(rng() % experts);
        if (st.count(st.phy2log()[p]) > 1) st.set_slot(p, e);
      } else {
        st.swap_slots(p, q);
      }
      std::vector<std::pair<double, int>> sorted;
      for (int g = 0; g < cl.gpus(); ++g) sorted.push_back({st.load(g), g});
      std::sort(sorted.begin(), sorted.end());
      ASSERT_EQ(st.argmax_gpu(), sorted.back().second) << cl.describe() << " step " << step;
      ASSERT_EQ(st.max_load(), sorted.back().first);
      for (size_t k : {size_t{0}, size_t{1}, size_t{5}, size_t{64}, size_t{100}, sorted.size()}) {
        st.lightest(k, light);
        ASSERT_EQ(light.size(), std::min(k, sorted.size()));
        for (size_t i = 0; i < light.size(); ++i) ASSERT_EQ(light[i], sorted[i].second) << "k " << k << " i " << i;
      }
    }
  }
}

// Moved from replace_test.cpp. Rewrites of experts with every number of replicas, from a few GPUs to
// all of them (a dominant expert of the heavy-tailed loads): LayerState restores its order from the
// GPUs that changed, one at a time below 9 replicas, else in one pass (the min-heap made again where a
// quarter of its GPUs fell below their entries; the blocks of the changed GPUs scanned again for the
// most loaded); the most loaded GPU and the lightest ones stay those of sorting every GPU.
TEST(LayerState, OrderAfterRewritesOfExpertsOfEverySize) {
  std::mt19937 rng(11);
  const Cluster cl{64, 8, 4};  // 512 GPUs, 2,048 slots
  const int experts = 256;     // the cold ones with 2-3 replicas
  std::vector<double> t(experts);
  for (double& x : t) x = static_cast<double>(1 + rng() % 50);
  t[0] = 40000, t[1] = 9000, t[2] = 2500;  // about 1,100, 250 and 70 replicas below
  std::vector<int> phy(cl.slots());
  for (int p = 0; p < cl.slots(); ++p)
    phy[p] = p < experts ? p : p < 1100 ? 0 : p < 1350 ? 1 : p < 1420 ? 2 : 3 + static_cast<int>(rng() % (experts - 3));
  std::shuffle(phy.begin(), phy.end(), rng);
  LayerState st(cl, t, phy);
  std::vector<int> light;
  int rewrites_by_size[3] = {0, 0, 0};  // rewrites that changed few, up to a quarter, more GPUs
  for (int step = 0; step < 600; ++step) {
    const int p = static_cast<int>(rng() % cl.slots());
    const int e = step % 4 == 0 ? static_cast<int>(rng() % experts) : static_cast<int>(rng() % 3);
    const int x = st.phy2log()[p];
    if (x == e || st.count(x) <= 1) continue;
    const size_t reps = st.slots_of(x).size() + st.slots_of(e).size();
    std::set<int> gpus;
    for (int s : st.slots_of(x)) gpus.insert(cl.gpu_of_slot(s));
    for (int s : st.slots_of(e)) gpus.insert(cl.gpu_of_slot(s));
    rewrites_by_size[reps <= 8 ? 0 : gpus.size() * 4 <= static_cast<size_t>(cl.gpus()) ? 1 : 2]++;
    st.set_slot(p, e);
    std::vector<std::pair<double, int>> sorted;
    for (int g = 0; g < cl.gpus(); ++g) sorted.push_back({st.load(g), g});
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(st.argmax_gpu(), sorted.back().second) << "step " << step;
    for (size_t k : {size_t{1}, size_t{64}, size_t{65}, size_t{200}}) {
      st.lightest(k, light);
      ASSERT_EQ(light.size(), k);
      for (size_t i = 0; i < k; ++i)
        ASSERT_EQ(light[i], sorted[i].second) << "step " << step << " k " << k << " i " << i;
    }
  }
  for (int n : rewrites_by_size) EXPECT_GE(n, 20);
}

// 1 node x 2 GPUs x 2 slots, shares {5, 3 | 2, 1}: loads 8 and 3. Swapping 5 with 2 or 3 with 1 both
// leave a maximum of 6 (the first found is kept); 5 with 1 gives 7, 3 with 2 gives 7.
TEST(LayerStateSearch, BestSwapLowersTheMaximumAsFarAsOneSwapCan) {
  LayerState st(Cluster{1, 2, 2}, {5, 3, 2, 1}, {0, 1, 2, 3});
  auto m = best_swap(st, 1);
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->rewrite);
  EXPECT_EQ(m->p, 0);
  EXPECT_EQ(m->q, 2);
  EXPECT_EQ(m->worst, 6.0);
  apply_move(st, *m);
  EXPECT_EQ(st.phy2log(), (std::vector<int>{2, 1, 0, 3}));
  EXPECT_EQ(st.gpu_loads(), (std::vector<double>{5, 6}));
  // Now {2, 3 | 5, 1}: no swap brings 6 lower.
  EXPECT_FALSE(best_swap(st, 1));
}

// 2 nodes x 1 GPU x 2 slots: GPU 0 {x, a}, GPU 1 {x, b} with shares x 3, a 6, b 1 (loads 9 and 4).
// Both swaps that reach 7 leave x on one node: allowed with f = 1, refused with f = 2.
TEST(LayerStateSearch, BestSwapKeepsEveryExpertOnFNodes) {
  LayerState st(Cluster{2, 1, 2}, {6, 6, 1}, {0, 1, 0, 2});
  auto m = best_swap(st, 1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->p, 0);
  EXPECT_EQ(m->q, 3);
  EXPECT_EQ(m->worst, 7.0);
  EXPECT_FALSE(best_swap(st, 2));
}

// 1 node x 3 GPUs x 1 slot: expert 0 (9) alone on GPU 0, expert 1 (1) on GPUs 1 and 2. No swap
// helps (9 only moves); a light slot of expert 1 becoming a second replica of expert 0 gives 4.5.
TEST(LayerStateSearch, BestRewriteAddsAReplicaOfTheHotExpert) {
  LayerState st(Cluster{1, 3, 1}, {9, 1}, {0, 1, 1});
  EXPECT_FALSE(best_swap(st, 1));
  auto m = best_rewrite(st, 1);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->rewrite);
  EXPECT_TRUE(m->p == 1 || m->p == 2) << m->p;
  EXPECT_EQ(m->q, 0);
  EXPECT_EQ(m->worst, 4.5);
  // With f = 2 expert 1 must keep its two replicas.
  EXPECT_FALSE(best_rewrite(st, 2));
}

TEST(LayerStateSearch, ReduceMaxAppliesMovesUntilNoneHelps) {
  {
    LayerState st(Cluster{1, 2, 2}, {5, 3, 2, 1}, {0, 1, 2, 3});
    EXPECT_EQ(reduce_max(st, 1, 10, false), 1);
    EXPECT_EQ(st.max_load(), 6.0);
  }
  {
    LayerState st(Cluster{1, 2, 2}, {5, 3, 2, 1}, {0, 1, 2, 3});
    EXPECT_EQ(reduce_max(st, 1, 0, false), 0);  // no moves allowed
    EXPECT_EQ(st.max_load(), 8.0);
  }
  {
    LayerState st(Cluster{1, 3, 1}, {9, 1}, {0, 1, 1});
    EXPECT_EQ(reduce_max(st, 1, 10, false), 0);  // only a rewrite helps
    EXPECT_EQ(reduce_max(st, 1, 10, true), 1);
    EXPECT_EQ(st.max_load(), 4.5);
    EXPECT_EQ(st.count(0), 2);
    EXPECT_EQ(st.count(1), 1);
  }
}

// 2 nodes x 1 GPU x 2 slots: expert 0 (share 2) twice on node 0. f = 2 takes one swap onto node 1;
// every candidate leaves both GPUs at 3, so the first (slot 0 with the lightest GPU's first slot).
TEST(LayerStateSearch, RepairSpreadsAnExpertOverFNodes) {
  LayerState st(Cluster{2, 1, 2}, {4, 1, 1}, {0, 0, 1, 2});
  {
    LayerState copy = st;
    EXPECT_TRUE(repair_fault_tolerance(copy, 1).empty());
    EXPECT_EQ(copy.phy2log(), st.phy2log());
  }
  auto swaps = repair_fault_tolerance(st, 2);
  ASSERT_EQ(swaps.size(), 1u);
  EXPECT_EQ(swaps[0], (std::pair<int, int>{0, 2}));
  EXPECT_EQ(st.phy2log(), (std::vector<int>{1, 0, 0, 2}));
  EXPECT_EQ(st.distinct(0), 2);
  EXPECT_EQ(st.gpu_loads(), (std::vector<double>{3, 3}));
  // An expert with one replica cannot be on two nodes: asked of nobody.
  EXPECT_EQ(st.distinct(1), 1);
}

// 4 nodes x 1 GPU x 4 slots, every share 1 (every GPU at 4). Experts 0 and 1 on nodes {0, 1}, expert
// 2 on {2, 3}; experts 3 and 4 on every node (one twice). Expert 2 moves onto nodes 0 and 1 by swaps
// with experts 3 and 4, which stay on 3 nodes: one node set of f = 2 is left.
TEST(LayerStateSearch, OverlapMergesTheSmallNodeSetIntoTheLargeOne) {
  const Cluster cl{4, 1, 4};
  const std::vector<double> t{2, 2, 2, 5, 5};
  const std::vector<int> phy{0, 1, 3, 4, 0, 1, 3, 4, 2, 3, 4, 3, 2, 4, 3, 4};
  {
    LayerState st(cl, t, phy);
    EXPECT_EQ(overlap_node_sets(st, 2, 4.0), (std::pair<int, int>{2, 1}));
    EXPECT_EQ(st.phy2log(), (std::vector<int>{0, 1, 2, 4, 0, 1, 3, 2, 3, 3, 4, 3, 4, 4, 3, 4}));
    EXPECT_EQ(st.distinct(2), 2);
    EXPECT_EQ(st.on_node(2, 0), 1);
    EXPECT_EQ(st.on_node(2, 1), 1);
    EXPECT_EQ(st.distinct(3), 3);
    EXPECT_EQ(st.distinct(4), 3);
    EXPECT_EQ(st.max_load(), 4.0);
  }
  {
    // A cap below the loads the swaps reach: nothing merges and the state is as it was.
    LayerState st(cl, t, phy);
    EXPECT_EQ(overlap_node_sets(st, 2, 3.9), (std::pair<int, int>{2, 2}));
    EXPECT_EQ(st.phy2log(), phy);
  }
}

}  // namespace layer_state_test
