// Re-placement that counts migration: copies and rounds against an independent count, the
// fault-tolerance guarantee kept from a plan without it, the byte budget and the weight rule, and the
// comparison with eplb-global re-run from scratch.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "placement/balance.h"
#include "placement/eplb.h"
#include "placement/planner.h"
#include "placement/replace.h"
#include "support/process.h"
#include "test_data.h"

namespace replace_test {

using namespace ucpkit::placement;

namespace {

LoadMatrix lognormal(int layers, int experts, unsigned seed, double sigma) {
  LoadMatrix w;
  w.layers = layers;
  w.experts = experts;
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> d(8.0, sigma);
  for (int i = 0; i < layers * experts; ++i) w.values.push_back(std::floor(d(rng)));
  return w;
}

std::vector<std::vector<int>> layers_of(const std::vector<LayerPlacement>& layers) {
  std::vector<std::vector<int>> out;
  for (const auto& l : layers) out.push_back(l.phy2log);
  return out;
}

// Copies counted here: per GPU, the multiset of new experts minus the multiset of old ones.
long long diff_count(const std::vector<int>& before, const std::vector<int>& after, const Cluster& cl) {
  long long n = 0;
  for (int g = 0; g < cl.gpus(); ++g) {
    std::map<int, int> have;
    for (int s = 0; s < cl.slots_per_gpu; ++s) have[before[g * cl.slots_per_gpu + s]]++;
    for (int s = 0; s < cl.slots_per_gpu; ++s)
      if (have[after[g * cl.slots_per_gpu + s]]-- <= 0) ++n;
  }
  return n;
}

int min_distinct_nodes(const std::vector<int>& phy2log, const Cluster& cl, int experts) {
  std::vector<std::set<int>> nodes(experts);
  for (size_t p = 0; p < phy2log.size(); ++p) nodes[phy2log[p]].insert(static_cast<int>(p) / cl.slots_per_node());
  int m = cl.nodes;
  for (const auto& s : nodes) m = std::min(m, static_cast<int>(s.size()));
  return m;
}

double overall(const std::vector<std::vector<int>>& layers, const LoadMatrix& w, const Cluster& cl) {
  double mean = 0, mx = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto g = gpu_loads(layers[l], w.layer_vector(l), cl);
    for (double x : g) mean += x / g.size();
    mx += *std::max_element(g.begin(), g.end());
  }
  return mean / mx;
}

// Every transfer checked: the source held the expert before, no GPU sends or receives twice in a
// round, and the received copies are exactly the per-GPU multiset difference.
void check_schedule(const std::vector<std::vector<int>>& before, const ReplaceResult& r, const Cluster& cl) {
  std::set<std::pair<int, int>> sends, recvs;
  std::map<std::tuple<int, int, int>, int> got;  // (layer, gpu, expert) -> copies received
  for (const auto& t : r.transfers) {
    EXPECT_TRUE(sends.insert({t.round, t.from}).second) << "GPU " << t.from << " sends twice in round " << t.round;
    EXPECT_TRUE(recvs.insert({t.round, t.to}).second) << "GPU " << t.to << " receives twice in round " << t.round;
    bool held = false;
    for (int s = 0; s < cl.slots_per_gpu; ++s) held = held || before[t.layer][t.from * cl.slots_per_gpu + s] == t.expert;
    EXPECT_TRUE(held) << "GPU " << t.from << " did not hold expert " << t.expert;
    EXPECT_LT(t.round, r.rounds);
    got[{t.layer, t.to, t.expert}]++;
  }
  long long total = 0;
  for (size_t l = 0; l < before.size(); ++l) {
    total += diff_count(before[l], r.layers[l].phy2log, cl);
    for (int g = 0; g < cl.gpus(); ++g) {
      std::map<int, int> need;
      for (int s = 0; s < cl.slots_per_gpu; ++s) need[r.layers[l].phy2log[g * cl.slots_per_gpu + s]]++;
      for (int s = 0; s < cl.slots_per_gpu; ++s) need[before[l][g * cl.slots_per_gpu + s]]--;
      for (const auto& [e, n] : need) {
        auto it = got.find({static_cast<int>(l), g, e});
        EXPECT_EQ(std::max(0, n), it == got.end() ? 0 : it->second) << "layer " << l << " GPU " << g << " expert " << e;
      }
    }
  }
  EXPECT_EQ(r.copies, total);
  EXPECT_EQ(static_cast<long long>(r.transfers.size()), total);
  EXPECT_GE(r.rounds, r.round_lower_bound);
}

}  // namespace

TEST(Replace, CopiesAndRoundsMatchAnIndependentCount) {
  for (unsigned seed = 1; seed <= 6; ++seed) {
    Cluster cl{2 + static_cast<int>(seed % 4) * 2, 2 + static_cast<int>(seed % 2) * 2, 2 + static_cast<int>(seed % 3)};
    int E = cl.slots() / 3;
    LoadMatrix old_w = lognormal(3, E, seed, 0.5), new_w = lognormal(3, E, seed + 100, 1.5);
    PlacementOptions o;
    o.fault_tolerance = 2;
    Plan prev = plan_placement(old_w, cl, "balanced-ft", o);
    ReplaceOptions ro;
    ro.fault_tolerance = 2;
    auto before = layers_of(prev.layers);
    ReplaceResult r = replace_with_migration(before, new_w, cl, ro);
    check_schedule(before, r, cl);
    for (const auto& l : r.layers) EXPECT_GE(min_distinct_nodes(l.phy2log, cl, E), 2);
    EXPECT_GE(overall(layers_of(r.layers), new_w, cl), overall(before, new_w, cl));
  }
}

TEST(Replace, RestoresFaultToleranceFromAnEplbPlan) {
  // eplb-global ignores f: some experts have one replica. The re-placement must give every expert
  // f = 2 nodes whatever the budget, and say how many copies that took.
  Cluster cl{4, 2, 4};
  LoadMatrix w = lognormal(2, 12, 5, 1.5);
  auto before = layers_of(eplb_rebalance(w, cl, 1, true));
  ASSERT_LT(min_distinct_nodes(before[0], cl, 12), 2);
  ReplaceOptions ro;
  ro.fault_tolerance = 2;
  ro.expert_bytes = 1;
  ro.max_moved_bytes = 0;
  ReplaceResult r = replace_with_migration(before, w, cl, ro);
  for (const auto& l : r.layers) EXPECT_GE(min_distinct_nodes(l.phy2log, cl, 12), 2);
  EXPECT_GT(r.mandatory_copies, 0);
  EXPECT_EQ(r.copies, r.mandatory_copies);  // no budget for anything else
  check_schedule(before, r, cl);
}

TEST(Replace, BudgetAndWeightTradeBalanceForCopies) {
  Cluster cl{8, 4, 4};
  LoadMatrix old_w = lognormal(4, 32, 7, 0.3), new_w = lognormal(4, 32, 8, 1.5);
  PlacementOptions o;
  o.fault_tolerance = 2;
  auto before = layers_of(plan_placement(old_w, cl, "balanced-ft", o).layers);
  double last_bal = 0;
  long long last_copies = -1;
  for (double budget : {0.0, 20.0, 80.0, 320.0, -1.0}) {
    ReplaceOptions ro;
    ro.fault_tolerance = 2;
    ro.expert_bytes = 1;
    ro.max_moved_bytes = budget;
    ReplaceResult r = replace_with_migration(before, new_w, cl, ro);
    if (budget >= 0) EXPECT_LE(r.copies, static_cast<long long>(budget) + r.mandatory_copies);
    double bal = overall(layers_of(r.layers), new_w, cl);
    EXPECT_GE(bal, last_bal - 1e-12) << "budget " << budget;
    EXPECT_GE(r.copies, last_copies);
    last_bal = bal;
    last_copies = r.copies;
    check_schedule(before, r, cl);
  }
  // A prohibitive weight moves nothing (the previous plan already meets f).
  ReplaceOptions heavy;
  heavy.fault_tolerance = 2;
  heavy.migration_weight = 1e9;
  ReplaceResult r = replace_with_migration(before, new_w, cl, heavy);
  EXPECT_EQ(r.copies, 0);
  EXPECT_EQ(layers_of(r.layers), before);
}

TEST(Replace, BeatsEplbFromScratchOnSmartMoeDrift) {
  std::string path = placement_test::shared_data("smartmoe_expert_loads.json");
  if (path.empty()) GTEST_SKIP() << "../shared/data/smartmoe_expert_loads.json not found (set UCPKIT_SOURCE)";
  LoadFileOptions first, last;
  first.snapshot = "1";
  LoadMatrix w0 = read_loads(path, first), w1 = read_loads(path, last);
  Cluster cl{8, 4, 4};
  PlacementOptions o;
  o.fault_tolerance = 2;
  auto before = layers_of(plan_placement(w0, cl, "balanced-ft", o).layers);
  ReplaceOptions ro;
  ro.fault_tolerance = 2;
  ReplaceResult r = replace_with_migration(before, w1, cl, ro);
  auto eplb = layers_of(eplb_rebalance(w1, cl, 1, true));
  long long eplb_copies = 0;
  for (size_t l = 0; l < before.size(); ++l) eplb_copies += diff_count(before[l], eplb[l], cl);
  double ours = overall(layers_of(r.layers), w1, cl), theirs = overall(eplb, w1, cl);
  std::printf("SmartMoE 1 -> 5001: re-placement %.4f with %lld copies; eplb-global from scratch %.4f with %lld\n", ours,
              r.copies, theirs, eplb_copies);
  EXPECT_GE(ours, theirs);
  EXPECT_LT(r.copies, eplb_copies);
  check_schedule(before, r, cl);
}

// A GPU that needs a second copy of an expert only it holds (the new plan doubles a replica in
// place) copies it locally. The scheduler looked for another holder forever: the round counter grew
// until a vector resize threw (exit 1, "vector::_M_fill_insert", after minutes), e.g. re-placing 16
// skewed experts on 4 nodes x 2 GPUs x 4 slots with f = 1.
TEST(Replace, ScheduleCopiesAnExpertOnlyTheReceiverHoldsLocally) {
  Cluster cl{2, 1, 2};
  const std::vector<std::vector<int>> before = {{0, 1, 2, 3}};
  ReplaceResult r;
  r.layers.push_back({{0, 0, 2, 3}, {}});
  r.copies = copies_between(before[0], r.layers[0].phy2log, cl);
  ucpkit::testing::within(std::chrono::seconds(20), "schedule_transfers with a local copy",
                          [&] { schedule_transfers(before, r, cl); });
  ASSERT_EQ(r.transfers.size(), 1u);
  EXPECT_EQ(r.transfers[0].from, 0);
  EXPECT_EQ(r.transfers[0].to, 0);
  EXPECT_EQ(r.transfers[0].expert, 0);
  EXPECT_EQ(r.rounds, 1);
  check_schedule(before, r, cl);
  // With another holder, that one sends (the copy crosses GPUs as before).
  const std::vector<std::vector<int>> shared = {{0, 1, 0, 3}};
  ReplaceResult s;
  s.layers.push_back({{0, 0, 0, 3}, {}});
  s.copies = copies_between(shared[0], s.layers[0].phy2log, cl);
  schedule_transfers(shared, s, cl);
  ASSERT_EQ(s.transfers.size(), 1u);
  EXPECT_EQ(s.transfers[0].from, 1);
  EXPECT_EQ(s.transfers[0].to, 0);
}

namespace {

// The schedule as specified, by the plainest means (the scan of every holder that schedule_transfers
// did before issue 31's fifth pass): per layer, per GPU in order, its slots in order; a slot whose
// expert the GPU's old slots do not cover (as multisets, first come first matched) is a copy; it
// goes in the earliest round the receiver is free and some holder (a GPU holding the expert before,
// not the receiver unless it is the only holder) is free, from the free holder with the fewest sends
// so far (all layers), the first of them in GPU order; an expert nobody held is read from a
// checkpoint (from -1) in the receiver's first free round.
std::vector<GpuTransfer> plain_schedule(const std::vector<std::vector<int>>& before,
                                        const std::vector<std::vector<int>>& after, const Cluster& cl, int& rounds) {
  const int D = cl.gpus(), S = cl.slots_per_gpu;
  std::set<std::pair<int, int>> busy_send, busy_recv;  // (gpu, round)
  std::vector<long long> sent(D, 0);
  std::vector<GpuTransfer> out;
  rounds = 0;
  for (size_t l = 0; l < before.size(); ++l) {
    std::map<int, std::vector<int>> holders;
    for (int g = 0; g < D; ++g)
      for (int s = 0; s < S; ++s) {
        auto& h = holders[before[l][g * S + s]];
        if (std::find(h.begin(), h.end(), g) == h.end()) h.push_back(g);
      }
    for (int g = 0; g < D; ++g) {
      std::map<int, int> have;
      for (int s = 0; s < S; ++s) have[before[l][g * S + s]]++;
      for (int s = 0; s < S; ++s) {
        const int e = after[l][g * S + s];
        if (have[e]-- > 0) continue;
        const std::vector<int> none;
        auto it = holders.find(e);
        const std::vector<int>& h = it == holders.end() ? none : it->second;
        for (int r = 0;; ++r) {
          if (busy_recv.count({g, r})) continue;
          int from = -1;
          if (!h.empty()) {
            for (int x : h) {
              if (x == g && h.size() > 1) continue;
              if (busy_send.count({x, r})) continue;
              if (from < 0 || sent[x] < sent[from]) from = x;
            }
            if (from < 0) continue;
            busy_send.insert({from, r});
            sent[from]++;
          }
          busy_recv.insert({g, r});
          out.push_back({static_cast<int>(l), e, from, g, r});
          rounds = std::max(rounds, r + 1);
          break;
        }
      }
    }
  }
  return out;
}

// Random layers: skewed expert choices (so some experts have many holders, some one, some none:
// lost), duplicates on a GPU, many layers so that the send counts carry over.
std::vector<std::vector<int>> random_layers(std::mt19937& rng, const Cluster& cl, int layers, int experts) {
  std::vector<std::vector<int>> out(layers, std::vector<int>(cl.slots()));
  for (auto& l : out) {
    std::geometric_distribution<int> skew(std::uniform_real_distribution<double>(0.05, 0.6)(rng));
    for (int& x : l) x = std::min(experts - 1, skew(rng));
    std::shuffle(l.begin(), l.end(), rng);
  }
  return out;
}

}  // namespace

// schedule_transfers keeps each expert's holders in a heap by (sends, GPU order) instead of scanning
// them (issue 31, fifth pass): the transfers, round for round and source for source, equal those of
// the plain scan above on random placements, small and large, with lost experts and local copies.
TEST(Replace, ScheduleEqualsThePlainScanOfEveryHolder) {
  std::mt19937 rng(31);
  int cases = 0;
  for (const Cluster cl : {Cluster{2, 1, 2}, Cluster{3, 2, 2}, Cluster{4, 2, 4}, Cluster{5, 3, 3}, Cluster{8, 4, 4},
                           Cluster{16, 8, 4}, Cluster{40, 8, 4}})
    for (int rep = 0; rep < 4; ++rep) {
      const int experts = std::max(2, cl.slots() / (2 + rep));
      const int layers = 1 + rep * 3;
      auto before = random_layers(rng, cl, layers, experts);
      auto after = random_layers(rng, cl, layers, experts);
      if (rep == 3)  // a second copy of a replica only its GPU holds: a local copy
        for (int l = 0; l < layers; ++l) {
          before[l][0] = experts + 5;
          after[l][0] = after[l][1] = experts + 5;
        }
      int rounds = 0;
      const auto want = plain_schedule(before, after, cl, rounds);
      // Rows of holders by send count (the default), none (the scan of the free holders), and room
      // for the first layer's rows only (they grow past it and the scan takes over mid-layer).
      for (size_t level_words : {size_t{1} << 22, size_t{0}, static_cast<size_t>(cl.slots() / 8 + 8)}) {
        ReplaceResult r;
        for (const auto& a : after) r.layers.push_back({a, {}});
        schedule_transfers(before, r, cl, level_words);
        ASSERT_EQ(r.transfers.size(), want.size()) << cl.describe() << " rep " << rep;
        for (size_t i = 0; i < want.size(); ++i) {
          const auto &a = r.transfers[i], &b = want[i];
          ASSERT_TRUE(a.layer == b.layer && a.expert == b.expert && a.from == b.from && a.to == b.to &&
                      a.round == b.round)
              << cl.describe() << " rep " << rep << " level words " << level_words << " transfer " << i << ": layer "
              << a.layer << "/" << b.layer << " expert " << a.expert << "/" << b.expert << " from " << a.from << "/"
              << b.from << " to " << a.to << "/" << b.to << " round " << a.round << "/" << b.round;
        }
        EXPECT_EQ(r.rounds, rounds);
      }
      cases += !want.empty();
    }
  EXPECT_GE(cases, 20);
}

// align_to's greedy node pairing (above 256 nodes), cost by cost and row by row, pairs exactly as
// walking all pairs sorted by (cost, row, column).
TEST(Replace, GreedyAssignmentEqualsPairsInCostRowColumnOrder) {
  std::mt19937 rng(7);
  for (int rep = 0; rep < 200; ++rep) {
    // Every tenth matrix wider than a word of columns (the rows' columns of a cost are kept as bits).
    const int n = rep % 10 == 0 ? 60 + static_cast<int>(rng() % 140) : 1 + static_cast<int>(rng() % 40);
    const int max_cost = static_cast<int>(rng() % (rep % 7 == 0 ? 70 : 12));  // sometimes more costs than a word
    std::vector<int> cost(static_cast<size_t>(n) * n);
    const int spread = 1 + static_cast<int>(rng() % (max_cost + 1));
    for (int& x : cost) x = max_cost - static_cast<int>(rng() % spread);
    std::vector<std::tuple<int, int, int>> pairs;
    for (int i = 0; i < n; ++i)
      for (int q = 0; q < n; ++q) pairs.emplace_back(cost[static_cast<size_t>(i) * n + q], i, q);
    std::sort(pairs.begin(), pairs.end());
    std::vector<int> want(n, -1);
    std::vector<char> taken(n, 0);
    for (const auto& [c, i, q] : pairs)
      if (want[i] < 0 && !taken[q]) want[i] = q, taken[q] = 1;
    EXPECT_EQ(greedy_assignment(cost, n, max_cost), want) << "n " << n << " max cost " << max_cost;
  }
}

// The bound that lets the re-placement align its from-scratch point only when needed: never above
// the fewest copies of any relabeling of nodes and of GPUs inside nodes (every one tried on clusters
// of up to 4 nodes x 3 GPUs), and equal to it in some cases (it is not a trivial bound).
TEST(Replace, AlignmentLowerBoundIsAtMostEveryRelabelingsCopies) {
  std::mt19937 rng(3);
  int tight = 0;
  for (int it = 0; it < 400; ++it) {
    const Cluster cl{1 + static_cast<int>(rng() % 4), 1 + static_cast<int>(rng() % 3), 1 + static_cast<int>(rng() % 3)};
    const int experts = 1 + static_cast<int>(rng() % std::min(6, cl.slots()));
    std::vector<int> before(cl.slots()), after(cl.slots());
    for (int p = 0; p < cl.slots(); ++p) before[p] = p < experts ? p : static_cast<int>(rng() % experts);
    for (int p = 0; p < cl.slots(); ++p) after[p] = p < experts ? p : static_cast<int>(rng() % experts);
    std::shuffle(before.begin(), before.end(), rng);
    std::shuffle(after.begin(), after.end(), rng);
    const long long bound = alignment_copies_lower_bound(before, after, cl, experts);
    // Every node relabeling, then the best GPU relabeling inside each node pair (independent per node).
    const int G = cl.gpus_per_node, S = cl.slots_per_gpu;
    std::vector<int> nodes(cl.nodes);
    std::iota(nodes.begin(), nodes.end(), 0);
    long long best = -1;
    do {
      long long copies = 0;
      for (int i = 0; i < cl.nodes; ++i) {
        std::vector<int> gpus(G);
        std::iota(gpus.begin(), gpus.end(), 0);
        long long node_best = -1;
        do {
          std::vector<int> b(before.begin() + i * G * S, before.begin() + (i + 1) * G * S), a(b.size());
          for (int g = 0; g < G; ++g)
            for (int s = 0; s < S; ++s) a[g * S + s] = after[(nodes[i] * G + gpus[g]) * S + s];
          const long long c = copies_between(b, a, Cluster{1, G, S});
          if (node_best < 0 || c < node_best) node_best = c;
        } while (std::next_permutation(gpus.begin(), gpus.end()));
        copies += node_best;
      }
      if (best < 0 || copies < best) best = copies;
    } while (std::next_permutation(nodes.begin(), nodes.end()));
    ASSERT_LE(bound, best) << "case " << it << " on " << cl.describe();
    tight += bound == best;
  }
  EXPECT_GT(tight, 100);
}

// Weight 0 without a budget takes every batch that lowers a maximum: a from-scratch point below
// every other point of its layer is aligned as soon as it is made (issue 45), and the result is the
// one a budget that never binds gives (there the point is aligned only when the walk needs it).
TEST(Replace, WeightZeroGivesWhatABudgetThatNeverBindsGives) {
  for (unsigned seed = 1; seed <= 4; ++seed) {
    const Cluster cl{4 + static_cast<int>(seed) * 2, 4, 4};
    const int E = 32;
    LoadMatrix old_w = lognormal(4, E, seed, 0.3), new_w = lognormal(4, E, seed + 50, 1.5);
    PlacementOptions o;
    o.fault_tolerance = 2;
    auto before = layers_of(plan_placement(old_w, cl, "balanced-ft", o).layers);
    ReplaceOptions free_ro, budget_ro;
    free_ro.fault_tolerance = budget_ro.fault_tolerance = 2;
    budget_ro.expert_bytes = 1;
    budget_ro.max_moved_bytes = 1e18;
    ReplaceResult a = replace_with_migration(before, new_w, cl, free_ro);
    ReplaceResult b = replace_with_migration(before, new_w, cl, budget_ro);
    EXPECT_EQ(layers_of(a.layers), layers_of(b.layers)) << "seed " << seed;
    EXPECT_EQ(a.copies, b.copies);
    EXPECT_EQ(a.layers_from_scratch, b.layers_from_scratch);
  }
}

}  // namespace replace_test
