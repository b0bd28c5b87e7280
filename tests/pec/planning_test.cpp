// Planning pieces of PEC without I/O (token input: tokens_test.cpp): policies, budget split, PLT,
// capacity, shard plan, AutoEP expert runs inside flat partitions.
#include <gtest/gtest.h>

#include <functional>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "formats/deepspeed/autoep_slices.h"
#include "pec/plt.h"
#include "pec/policy.h"
#include "pec/shard_plan.h"
#include "pec/tokens.h"

namespace planning_test {

using namespace ucpkit;
using namespace ucpkit::pec;

static SelectionRequest request(std::vector<int> experts, int ep, int k) {
  SelectionRequest r;
  r.shape.experts_per_layer = std::move(experts);
  r.shape.ep_size = ep;
  r.k = k;
  return r;
}

TEST(PecPolicy, RegistryKnowsAllPolicies) {
  auto names = policy_names();
  for (const char* n : {"sequential", "load-aware", "budget"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
  EXPECT_THROW(make_policy("nope"), UsageError);
}

TEST(PecPolicy, SequentialCoversEveryExpertWithinCeilEOverK) {
  for (int e : {4, 8, 16, 6}) {
    for (int k : {1, 2, 3, 4, 5}) {
      for (int ep : {1, 2, 4}) {
        if (e % ep) continue;
        auto r = request({e, e, e}, ep, k);
        auto pol = make_policy("sequential");
        int saves = (e + k - 1) / k;
        for (int64_t first = 0; first < 3; ++first) {  // from any point in the rotation
          std::vector<std::set<int>> seen(3);
          for (int s = 0; s < saves; ++s) {
            r.save_index = first + s;
            auto sel = pol->select(r);
            for (int l = 0; l < 3; ++l) {
              EXPECT_EQ(sel[l].size(), static_cast<size_t>(std::min(k, e)));
              seen[l].insert(sel[l].begin(), sel[l].end());
            }
          }
          for (int l = 0; l < 3; ++l) EXPECT_EQ(seen[l].size(), static_cast<size_t>(e)) << e << " " << k << " " << ep;
        }
      }
    }
  }
}

TEST(PecPolicy, SequentialBalancesEpRanks) {
  // 12 MoE layers x 16 experts on 4 EP ranks, K=1: each save, each rank saves 3 experts.
  auto r = request(std::vector<int>(12, 16), 4, 1);
  auto pol = make_policy("sequential");
  for (int s = 0; s < 20; ++s) {
    r.save_index = s;
    auto sel = pol->select(r);
    std::vector<int> per_rank(4, 0);
    for (int l = 0; l < 12; ++l)
      for (int e : sel[l]) per_rank[r.shape.ep_rank_of(l, e)]++;
    int mx = *std::max_element(per_rank.begin(), per_rank.end());
    int mn = *std::min_element(per_rank.begin(), per_rank.end());
    EXPECT_LE(mx - mn, 1) << "save " << s;
  }
}

TEST(PecPolicy, Deterministic) {
  auto r = request({8, 8}, 2, 3);
  r.unsaved_tokens = {{5, 1, 9, 9, 0, 2, 7, 3}, {1, 1, 1, 1, 1, 1, 1, 1}};
  r.expert_bytes = {std::vector<uint64_t>(8, 100), std::vector<uint64_t>(8, 100)};
  r.budget_bytes = 550;
  for (auto name : policy_names()) {
    auto p = make_policy(name);
    for (int s = 0; s < 5; ++s) {
      r.save_index = s;
      EXPECT_EQ(p->select(r), make_policy(name)->select(r)) << name;
    }
  }
}

TEST(PecPolicy, LoadAwareTakesMostTokensSinceLastSave) {
  auto r = request({6}, 1, 2);
  r.unsaved_tokens = {{5, 50, 7, 50, 1, 0}};
  r.last_saved_step = {{0, 10, 0, 5, 0, 0}};
  auto sel = make_policy("load-aware")->select(r);
  EXPECT_EQ(sel[0], (std::vector<int>{1, 3}));
  r.k = 3;
  EXPECT_EQ(make_policy("load-aware")->select(r)[0], (std::vector<int>{1, 2, 3}));
}

TEST(PecPolicy, BudgetRespectsBytesAndSplitsByRisk) {
  auto r = request({8, 8, 8}, 1, 0);
  r.unsaved_tokens = {{100, 90, 80, 0, 0, 0, 0, 0}, {10, 10, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 600}};
  r.expert_bytes = {std::vector<uint64_t>(8, 1000), std::vector<uint64_t>(8, 1000), std::vector<uint64_t>(8, 1000)};
  for (uint64_t budget : {0ull, 999ull, 1000ull, 4500ull, 8000ull, 30000ull}) {
    r.budget_bytes = budget;
    if (budget == 0) {
      EXPECT_THROW(make_policy("budget")->select(r), UsageError);
      continue;
    }
    auto sel = make_policy("budget")->select(r);
    uint64_t used = 0;
    for (size_t l = 0; l < 3; ++l) used += sel[l].size() * 1000;
    EXPECT_LE(used, budget);
    EXPECT_EQ(used, std::min<uint64_t>(budget / 1000, 24) * 1000);  // uses all of it
  }
  // 8 experts, risk 270 : 20 : 600 -> shares 2.43, 0.18, 5.39 -> floors 2, 0, 5; the one left goes to layer 0 (.43)
  r.budget_bytes = 8000;
  auto sel = make_policy("budget")->select(r);
  EXPECT_EQ(sel[0].size(), 3u);
  EXPECT_EQ(sel[1].size(), 0u);
  EXPECT_EQ(sel[2].size(), 5u);
  EXPECT_EQ(sel[0], (std::vector<int>{0, 1, 2}));  // most popular first
  EXPECT_NE(std::find(sel[2].begin(), sel[2].end(), 7), sel[2].end());
}

TEST(PecPolicy, SplitByRiskCapsAndRedistributes) {
  auto s = split_by_risk(10, {1000, 1, 1}, {4, 8, 8});
  EXPECT_EQ(s[0], 4);
  EXPECT_EQ(s[0] + s[1] + s[2], 10);
  auto even = split_by_risk(7, {0, 0, 0}, {8, 8, 8});
  EXPECT_EQ(even[0] + even[1] + even[2], 7);
  EXPECT_LE(*std::max_element(even.begin(), even.end()) - *std::min_element(even.begin(), even.end()), 1);
  auto all = split_by_risk(100, {1, 2, 3}, {2, 2, 2});
  EXPECT_EQ(all, (std::vector<int>{2, 2, 2}));
}

TEST(PecPlt, MatchesFormula) {
  TokenMatrix processed = {{100, 100, 200, 0}, {50, 50}};
  TokenMatrix lost = {{0, 100, 50, 0}, {0, 0}};
  auto p = compute_plt(lost, processed);
  ASSERT_EQ(p.per_layer.size(), 2u);
  EXPECT_DOUBLE_EQ(p.per_layer[0], 150.0 / 400.0);
  EXPECT_DOUBLE_EQ(p.per_layer[1], 0.0);
  EXPECT_DOUBLE_EQ(p.overall, (150.0 / 400.0) / 2);
}

TEST(PecPlt, DynamicKDoublesPastThreshold) {
  EXPECT_EQ(next_k(2, 16, 0.05, 0.0375), 4);
  EXPECT_EQ(next_k(2, 16, 0.03, 0.0375), 2);
  EXPECT_EQ(next_k(12, 16, 0.5, 0.0375), 16);
  EXPECT_EQ(next_k(0, 16, 0.0, 0.0375), 1);
}

TEST(PecPlt, CapacityPlan) {
  TokenMatrix lost = {{0, 100, 0}, {7}};
  std::vector<std::vector<double>> rate = {{10, 20, 30}, {0}};
  auto plan = capacity_plan(lost, rate, 1.1);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].expert, 1);
  EXPECT_EQ(plan[0].iterations, 50);  // 100 / (0.1 * 20)
  EXPECT_DOUBLE_EQ(plan[0].capacity_factor, 1.1);
  EXPECT_EQ(plan[1].iterations, 7);  // no rate at all: one per lost token
}

TEST(PecPlt, SizeFormula) {
  EXPECT_DOUBLE_EQ(pec_size_ratio(1, 3, 1, 4), (1 + 0.75) / 4.0);
  EXPECT_DOUBLE_EQ(pec_size_ratio(1, 3, 4, 4), 1.0);
}

TEST(PecShardPlan, ExpertsStayInTheirEpGroupAndNonExpertBalances) {
  MoeShape shape;
  shape.experts_per_layer = {8, 8};
  shape.ep_size = 2;
  std::vector<SaveItem> items;
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 8; e += 2) items.push_back({"e", 100, l, e});
  items.push_back({"embed", 500});
  items.push_back({"attn0", 300});
  items.push_back({"attn1", 300});
  items.push_back({"ln", 10});
  auto plan = plan_fully_sharded(items, shape, 4);
  uint64_t total = 0;
  for (int g = 0; g < 4; ++g) {
    total += plan.bytes_of_rank[g];
    for (size_t i : plan.items_of_rank[g])
      if (items[i].is_expert()) EXPECT_EQ(g % 2, shape.ep_rank_of(items[i].moe_layer, items[i].expert));
  }
  EXPECT_EQ(total, 800u + 1110u);
  EXPECT_EQ(plan.max_rank_bytes(), 700u);  // every rank saves 200 B of experts; + the 500 B module
  auto j = shard_plan_to_json(plan, items);
  EXPECT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(plan_fully_sharded(items, shape, 4).items_of_rank, plan.items_of_rank);
}

namespace {
std::vector<std::tuple<int, int64_t, int64_t>> as_tuples(const std::vector<formats::deepspeed::AutoEpExpertRun>& runs) {
  std::vector<std::tuple<int, int64_t, int64_t>> out;
  for (const auto& r : runs) out.emplace_back(r.global_expert, r.offset, r.numel);
  return out;
}
using Runs = std::vector<std::tuple<int, int64_t, int64_t>>;
}  // namespace

// Hand-computed layouts (docs/formats.md "AutoEP under ZeRO-3"): w1 [2, 10, 8] of EP rank 1 (n = 160,
// 80 elements per expert) over 3 expert-DP ranks: ceil(160 / 3) = 54 per rank, the last one 52 + 2
// padding. part = ep_rank * 3 + partition_rank.
TEST(PecAutoEpSlices, Zero3FragmentsSplitPerExpert) {
  const std::vector<int64_t> shape = {2, 10, 8};
  EXPECT_EQ(as_tuples(formats::deepspeed::autoep_zero3_fragment_runs(shape, 3, 3, 54, "f", "w1")), (Runs{{2, 0, 54}}));
  EXPECT_EQ(as_tuples(formats::deepspeed::autoep_zero3_fragment_runs(shape, 3, 4, 54, "f", "w1")), (Runs{{2, 0, 26}, {3, 26, 28}}));
  EXPECT_EQ(as_tuples(formats::deepspeed::autoep_zero3_fragment_runs(shape, 3, 5, 52, "f", "w1")), (Runs{{3, 0, 52}}));
  EXPECT_EQ(as_tuples(formats::deepspeed::autoep_zero3_fragment_runs(shape, 3, 1, 54, "f", "w1")), (Runs{{0, 0, 26}, {1, 26, 28}}));
  // The padding is not part of the weight: a fragment running into it is refused, naming the file.
  try {
    (void)formats::deepspeed::autoep_zero3_fragment_runs(shape, 3, 5, 54, "shard.pt", "w1");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shard.pt"), std::string::npos) << e.what();
  }
}

// ZeRO-1/2: the weight starts 100 elements into its group's flat buffer; expert-DP rank 1's partition
// of 150 elements starts at element 150, i.e. 50 elements into the weight (96 per expert, 2 local
// experts of EP rank 1 = global 2 and 3).
TEST(PecAutoEpSlices, Zero12FragmentsSplitPerExpert) {
  const formats::deepspeed::AutoEpZero12Weight w{0, 2, 100, 96};
  EXPECT_EQ(as_tuples(formats::deepspeed::autoep_zero12_fragment_runs(w, 1, 1, 150, 0, 50, "f", "w1")), (Runs{{2, 0, 46}, {3, 46, 4}}));
  EXPECT_EQ(as_tuples(formats::deepspeed::autoep_zero12_fragment_runs(w, 0, 0, 150, 100, 50, "f", "w1")), (Runs{{0, 0, 50}}));
  EXPECT_THROW((void)formats::deepspeed::autoep_zero12_fragment_runs(w, 0, 0, 150, 90, 50, "f", "w1"), Error);  // starts before it
}

}  // namespace planning_test
