// --min-recovery k:p (min_recovery.h): parsing, the search, and on the SmartMoE loads the plan's
// P(k nodes down) recomputed here from its slots over every set of k failed nodes.
#include "placement/min_recovery.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "placement/planner.h"
#include "test_data.h"

namespace ucpkit::placement {
namespace min_recovery_test {
namespace {

TEST(MinRecovery, ParsesKColonP) {
  const MinRecovery m = parse_min_recovery("2:0.95");
  EXPECT_EQ(m.k, 2);
  EXPECT_DOUBLE_EQ(m.p, 0.95);
  EXPECT_DOUBLE_EQ(parse_min_recovery("1:1").p, 1.0);
  for (const char* bad : {"", "2", ":0.9", "2:", "0:0.5", "-1:0.5", "2:1.5", "2:-0.1", "2:nan", "2:0.5x", "x:0.5",
                          "1.5:0.5", "2:inf"})
    EXPECT_THROW(parse_min_recovery(bad), UsageError) << bad;
}

TEST(MinRecovery, BisectionReturnsAWeightThatMeetsTheTargetAndOneJustBelowThatDoesNot) {
  std::vector<double> asked;
  auto step = [&](double w) {  // P(k) jumps to 0.9 at w = 0.3, like a layer switching candidates
    asked.push_back(w);
    return w >= 0.3 ? 0.9 : 0.5;
  };
  MinRecoveryChoice c = smallest_recovery_weight({2, 0.8}, step);
  EXPECT_GE(c.weight, 0.3);
  EXPECT_LE(c.weight, 0.3 + 1.0 / 128);
  EXPECT_DOUBLE_EQ(c.achieved, 0.9);
  EXPECT_EQ(c.evaluations, 9);  // w = 0, w = 1, 7 halvings
  EXPECT_EQ(static_cast<int>(asked.size()), c.evaluations);
  c = smallest_recovery_weight({2, 0.4}, step);  // already met by the default
  EXPECT_EQ(c.weight, 0);
  EXPECT_EQ(c.evaluations, 1);
  EXPECT_THROW(smallest_recovery_weight({2, 0.95}, step), UsageError);  // not even at w = 1
}

// P(every expert of a layer keeps a replica) over every set of k failed nodes, averaged over layers
// (the plan's recovery_probability), from the plan's slots alone.
double exact_recovery(const nlohmann::json& plan, int k) {
  const int N = plan.at("nodes").get<int>(), per_node = plan.at("gpus_per_node").get<int>() * plan.at("slots_per_gpu").get<int>();
  double sum = 0;
  for (const auto& layer : plan.at("layers")) {
    const auto slots = layer.at("phy2log").get<std::vector<int>>();
    long long ok = 0, all = 0;
    for (unsigned mask = 0; mask < (1u << N); ++mask) {
      if (__builtin_popcount(mask) != k) continue;
      ++all;
      std::set<int> alive, every(slots.begin(), slots.end());
      for (size_t p = 0; p < slots.size(); ++p)
        if (!((mask >> (p / per_node)) & 1)) alive.insert(slots[p]);
      ok += alive == every;
    }
    sum += static_cast<double>(ok) / all;
  }
  return sum / plan.at("layers").size();
}

TEST(MinRecovery, SmartMoePlanMeetsTheTargetAndTheNextLowerWeightDoesNot) {
  const std::string path = placement_test::shared_data("smartmoe_expert_loads.json");
  if (path.empty()) GTEST_SKIP() << "../shared/data/smartmoe_expert_loads.json absent";
  auto request = [&](double weight, bool with_target) {
    PlanRequest req;
    req.loads_path = path;
    req.sizes.nodes = 8;
    req.sizes.gpus_per_node = 4;
    req.sizes.slots_per_gpu = 4;
    req.sizes.fault_tolerance = 2;
    if (with_target) req.min_recovery = MinRecovery{2, 0.9};
    req.placement.recovery_weight = weight;
    return make_plan(req);
  };
  const PlanOutcome out = request(0, true);
  const auto& chosen = out.summary.at("min_recovery");
  const double w = chosen.at("recovery_weight").get<double>();
  const nlohmann::json plan = nlohmann::json::parse(out.plan_file_text());
  const double p2 = exact_recovery(plan, 2);
  std::printf("--min-recovery 2:0.9 on SmartMoE 8 x 4 x 4: weight %.4f, P(2 nodes down) %.4f (recomputed %.4f)\n", w,
              chosen.at("achieved").get<double>(), p2);
  EXPECT_GE(p2, 0.9);
  EXPECT_NEAR(p2, chosen.at("achieved").get<double>(), 1e-12);
  ASSERT_GT(w, 0);  // the default (w = 0) has P(2 nodes down) 0.76 here
  const PlanOutcome below = request(w - 1.0 / 128, false);
  EXPECT_LT(exact_recovery(nlohmann::json::parse(below.plan_file_text()), 2), 0.9);
  const PlanOutcome same = request(w, false);  // the plan is balanced-ft at that weight
  EXPECT_EQ(same.plan_file_text(), out.plan_file_text());
  // Unreachable under f = 2: exit 2 (UsageError), nothing planned.
  PlanRequest req;
  req.loads_path = path;
  req.sizes.nodes = 8, req.sizes.gpus_per_node = 4, req.sizes.slots_per_gpu = 4, req.sizes.fault_tolerance = 2;
  req.min_recovery = MinRecovery{2, 0.999};
  EXPECT_THROW(make_plan(req), UsageError);
  req.min_recovery = MinRecovery{8, 0.5};  // k must leave a node
  EXPECT_THROW(make_plan(req), UsageError);
  req.min_recovery = MinRecovery{2, 0.5};
  req.placement.recovery_weight = 0.5;  // exclusive
  EXPECT_THROW(make_plan(req), UsageError);
}

}  // namespace
}  // namespace min_recovery_test
}  // namespace ucpkit::placement
