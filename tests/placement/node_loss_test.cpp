// Node-loss re-placement under the migration model (issue 31 item 3), checked independently: every
// scheduled copy comes from a GPU of a surviving node that held the expert in the current plan (or
// from a checkpoint only when no survivor held it), no GPU sends or receives twice in a round, the
// copies turn the survivors' placement into the new plan, the fault tolerance holds, the node fetch
// count is recounted from the two plans, and the byte budget bounds the fetches beyond the mandatory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "placement/balance.h"
#include "placement/node_loss.h"
#include "placement/planner.h"
#include "test_data.h"

namespace node_loss_test {

using namespace ucpkit::placement;

namespace {

// Zipf loads with exponent s, ranks shuffled per layer.
LoadMatrix zipf(int layers, int experts, double s, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<double> values;
  std::vector<int> rank(experts);
  for (int l = 0; l < layers; ++l) {
    std::iota(rank.begin(), rank.end(), 1);
    std::shuffle(rank.begin(), rank.end(), rng);
    for (int r : rank) values.push_back(std::floor(100000.0 / std::pow(r, s)) + 1);
  }
  return LoadMatrix{static_cast<size_t>(layers), static_cast<size_t>(experts), values};
}

// The experts GPU `gpu` of physical node `phys` held in the current plan (layer l), as a multiset.
std::multiset<int> held_by(const Plan& cur, int l, int phys, int gpu_in_node) {
  const int idx = static_cast<int>(std::find(cur.node_ids.begin(), cur.node_ids.end(), phys) - cur.node_ids.begin());
  const int S = cur.cluster.slots_per_gpu, G = cur.cluster.gpus_per_node;
  std::multiset<int> out;
  for (int s = 0; s < S; ++s) out.insert(cur.layers[l].phy2log[(idx * G + gpu_in_node) * S + s]);
  return out;
}

struct Checked {
  long long node_fetches = 0, gpu_copies = 0;
};

// The independent checker: from the current plan, the failed nodes and the new plan alone.
Checked check_schedule(const Plan& cur, const std::set<int>& failed, const Plan& next, const ReplaceResult& r, int f) {
  const Cluster& cl = next.cluster;
  const int G = cl.gpus_per_node, S = cl.slots_per_gpu;
  Checked c;
  // Per (layer, receiving GPU): experts received; per (round, GPU): sends and receives.
  std::map<std::pair<int, int>, std::multiset<int>> received;
  std::map<std::pair<int, int>, int> sends, recvs;
  for (const auto& t : r.transfers) {
    const int to_node = next.node_ids[t.to / G];
    EXPECT_EQ(failed.count(to_node), 0u);
    if (t.from < 0) {  // from a checkpoint: no surviving GPU may hold it
      for (int i = 0; i < cl.nodes; ++i)
        for (int g = 0; g < G; ++g) EXPECT_EQ(held_by(cur, t.layer, next.node_ids[i], g).count(t.expert), 0u);
    } else {
      const int from_node = next.node_ids[t.from / G];
      EXPECT_EQ(failed.count(from_node), 0u) << "source on a failed node";
      EXPECT_GT(held_by(cur, t.layer, from_node, t.from % G).count(t.expert), 0u)
          << "layer " << t.layer << " expert " << t.expert << " source GPU " << t.from << " did not hold it";
      EXPECT_LE(++sends[std::make_pair(t.round, t.from)], 1) << "GPU " << t.from << " sends twice in round " << t.round;
    }
    EXPECT_LE(++recvs[std::make_pair(t.round, t.to)], 1) << "GPU " << t.to << " receives twice in round " << t.round;
    EXPECT_LT(t.round, r.rounds);
    received[{t.layer, t.to}].insert(t.expert);
  }
  for (size_t l = 0; l < next.layers.size(); ++l) {
    std::vector<std::set<int>> nodes_of(next.experts);
    for (int i = 0; i < cl.nodes; ++i) {
      std::set<int> had, has;
      for (int g = 0; g < G; ++g) {
        std::multiset<int> old = held_by(cur, static_cast<int>(l), next.node_ids[i], g), now;
        for (int s = 0; s < S; ++s) now.insert(next.layers[l].phy2log[(i * G + g) * S + s]);
        had.insert(old.begin(), old.end());
        has.insert(now.begin(), now.end());
        // now = (old minus what the GPU gives up) plus what it receives, as multisets.
        std::multiset<int> need;
        std::multiset<int> left = old;
        for (int e : now) {
          auto it = left.find(e);
          if (it != left.end())
            left.erase(it);
          else
            need.insert(e);
        }
        EXPECT_EQ(need, received[std::make_pair(static_cast<int>(l), i * G + g)]) << "layer " << l << " GPU " << i * G + g;
        c.gpu_copies += static_cast<long long>(need.size());
      }
      for (int e : has) {
        nodes_of[e].insert(i);
        if (!had.count(e)) ++c.node_fetches;
      }
    }
    for (int e = 0; e < next.experts; ++e) EXPECT_GE(static_cast<int>(nodes_of[e].size()), f) << "expert " << e;
  }
  return c;
}

}  // namespace

TEST(NodeLoss, ScheduleNamesSurvivingSourcesAndKeepsLinkLimits) {
  struct Case {
    int nodes, gpus, slots, experts, f;
    std::vector<int> failed;
    double s;
  } cases[] = {{8, 4, 4, 32, 2, {0}, 1.2}, {8, 2, 6, 24, 2, {3, 5}, 0.6}, {16, 2, 4, 40, 3, {15}, 1.5},
               {4, 2, 2, 12, 1, {1}, 1.0}, {6, 1, 4, 10, 1, {2, 4}, 0.8}};
  unsigned seed = 1;
  for (const auto& k : cases) {
    SCOPED_TRACE(std::to_string(k.nodes) + "x" + std::to_string(k.gpus) + "x" + std::to_string(k.slots));
    LoadMatrix w = zipf(3, k.experts, k.s, seed++);
    PlacementOptions po;
    po.fault_tolerance = k.f;
    Plan cur = plan_placement(w, Cluster{k.nodes, k.gpus, k.slots}, "balanced-ft", po);
    std::vector<int> physical;
    for (int i = 0; i < k.nodes; ++i)
      if (std::find(k.failed.begin(), k.failed.end(), i) == k.failed.end()) physical.push_back(i);
    Cluster target{static_cast<int>(physical.size()), k.gpus, k.slots};
    const int f = std::min<int>(k.f, std::min<long long>(target.nodes, target.slots() / k.experts));
    for (double weight : {0.0, 0.5, 4.0}) {
      ReplaceOptions ro;
      ro.fault_tolerance = f;
      ro.migration_weight = weight;
      Plan next;
      NodeLossResult res = replace_after_node_loss(cur, physical, w, target, ro, next);
      Checked c = check_schedule(cur, {k.failed.begin(), k.failed.end()}, next, res.replacement, f);
      EXPECT_EQ(c.node_fetches, res.fetches.replicas_moved) << "weight " << weight;
      EXPECT_EQ(c.gpu_copies, res.replacement.copies) << "weight " << weight;
      EXPECT_GE(res.replacement.rounds, res.replacement.round_lower_bound);
    }
    // A byte budget of B copies: the node fetches beyond those of the mandatory step stay within B.
    ReplaceOptions zero;
    zero.fault_tolerance = f;
    zero.expert_bytes = 1;
    zero.max_moved_bytes = 0;
    Plan base_plan;
    const long long mandatory = replace_after_node_loss(cur, physical, w, target, zero, base_plan).fetches.replicas_moved;
    ReplaceOptions budget = zero;
    budget.max_moved_bytes = 5;
    Plan next;
    NodeLossResult res = replace_after_node_loss(cur, physical, w, target, budget, next);
    check_schedule(cur, {k.failed.begin(), k.failed.end()}, next, res.replacement, f);
    EXPECT_LE(res.fetches.replicas_moved, mandatory + 5);
  }
}

// Every layer of `next` has a most loaded GPU no heavier than `scratch`'s.
void expect_no_higher_maximum(const Plan& next, const Plan& scratch, const LoadMatrix& w, const Cluster& target) {
  for (size_t l = 0; l < w.layers; ++l) {
    auto a = gpu_loads(next.layers[l].phy2log, w.layer_vector(l), target);
    auto b = gpu_loads(scratch.layers[l].phy2log, w.layer_vector(l), target);
    EXPECT_LE(*std::max_element(a.begin(), a.end()), *std::max_element(b.begin(), b.end()) * (1 + 1e-12)) << l;
  }
}

// Weight 0 with no budget may go as far as balanced-ft from scratch, so it is at least as balanced as
// --current without the options (which is that placement, matched onto the survivors).
TEST(NodeLoss, WeightZeroIsAtLeastAsBalancedAsPlacingFromScratch) {
  LoadMatrix w = zipf(4, 32, 1.0, 11);
  PlacementOptions po;
  po.fault_tolerance = 2;
  Plan cur = plan_placement(w, Cluster{8, 4, 4}, "balanced-ft", po);
  Cluster target{7, 4, 4};
  std::vector<int> physical = {0, 1, 2, 4, 5, 6, 7};
  Plan scratch = plan_placement(w, target, "balanced-ft", po);
  ReplaceOptions ro;
  ro.fault_tolerance = 2;
  Plan next;
  replace_after_node_loss(cur, physical, w, target, ro, next);
  expect_no_higher_maximum(next, scratch, w, target);
}

// Issue 31's case: SmartMoE loads (latest snapshot), 8 nodes x 4 GPUs x 4 slots, f = 2, node 0 lost.
// Lazarus' own re-placement (its plan, re-placed by lazarus, nodes matched) fetches far fewer experts
// than balanced-ft placed again from scratch; some migration weight reaches at most Lazarus' fetches
// at no less balance than the from-scratch plan. Both references are computed here, not copied.
TEST(NodeLoss, SmartMoeOneOfEightNodesFetchesNoMoreThanLazarusAtNoLessBalance) {
  std::string path = placement_test::shared_data("smartmoe_expert_loads.json");
  if (path.empty()) GTEST_SKIP() << "../shared/data/smartmoe_expert_loads.json not found (set UCPKIT_SOURCE)";
  LoadMatrix w = read_loads(path, {});
  PlacementOptions po;
  po.fault_tolerance = 2;
  const Cluster cl{8, 4, 4}, target{7, 4, 4};
  const std::vector<int> physical = {1, 2, 3, 4, 5, 6, 7};
  auto overall = [&](const Plan& p) {
    double mean = 0, mx = 0;
    for (size_t l = 0; l < w.layers; ++l) {
      auto g = gpu_loads(p.layers[l].phy2log, w.layer_vector(l), p.cluster);
      for (double x : g) mean += x / static_cast<double>(g.size());
      mx += *std::max_element(g.begin(), g.end());
    }
    return mean / mx;
  };
  Plan laz = plan_placement(w, cl, "lazarus", po);
  Plan laz_next = plan_placement(w, target, "lazarus", po);
  const long long lazarus_fetches = migrate(laz, laz_next, physical).replicas_moved;
  Plan cur = plan_placement(w, cl, "balanced-ft", po);
  Plan scratch = plan_placement(w, target, "balanced-ft", po);
  const long long scratch_fetches = migrate(cur, scratch, physical).replicas_moved;
  const double scratch_balance = overall(scratch);
  bool met = false;
  for (double weight : {0.25, 0.5, 0.75, 1.0, 1.5}) {
    ReplaceOptions ro;
    ro.fault_tolerance = 2;
    ro.migration_weight = weight;
    Plan next;
    NodeLossResult res = replace_after_node_loss(cur, physical, w, target, ro, next);
    std::printf("weight %.2f: %lld fetches, balancedness %.4f (lazarus %lld; from scratch %lld at %.4f)\n", weight,
                res.fetches.replicas_moved, overall(next), lazarus_fetches, scratch_fetches, scratch_balance);
    met = met || (res.fetches.replicas_moved <= lazarus_fetches && overall(next) >= scratch_balance);
  }
  EXPECT_TRUE(met);
}

// Above 256 nodes (issue 31, the re-placements at 1,024 nodes in seconds): with a weight > 0 the
// re-placement has no from-scratch option (none is placed, none reported), and the schedule still
// checks; with weight 0 the from-scratch placement is still an option, so weight 0 stays at least as
// balanced as it.
TEST(NodeLoss, AboveTwoHundredFiftySixNodesAWeightLeavesOutThePlacementFromScratch) {
  LoadMatrix w = zipf(2, 24, 1.0, 5);
  PlacementOptions po;
  po.fault_tolerance = 2;
  Plan cur = plan_placement(w, Cluster{260, 1, 2}, "balanced-ft", po);
  Cluster target{259, 1, 2};
  std::vector<int> physical;
  for (int i = 1; i < 260; ++i) physical.push_back(i);
  ReplaceOptions ro;
  ro.fault_tolerance = 2;
  ro.migration_weight = 0.5;
  Plan next;
  NodeLossResult res = replace_after_node_loss(cur, physical, w, target, ro, next);
  EXPECT_TRUE(res.replacement.from_scratch.empty());
  EXPECT_EQ(res.replacement.layers_from_scratch, 0);
  check_schedule(cur, {0}, next, res.replacement, 2);
  ro.migration_weight = 0;
  Plan next0;
  NodeLossResult res0 = replace_after_node_loss(cur, physical, w, target, ro, next0);
  ASSERT_EQ(res0.replacement.from_scratch.size(), w.layers);
  check_schedule(cur, {0}, next0, res0.replacement, 2);
  expect_no_higher_maximum(next0, plan_placement(w, target, "balanced-ft", po), w, target);
}

}  // namespace node_loss_test
