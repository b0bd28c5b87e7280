// The moe-replace pipeline as data (lib/placement/planner.cpp): parse_id_list, plan_placement on
// layers whose placement is forced by the slot count, and make_plan for a fresh plan, a node loss on
// a --current plan and a --previous re-placement, with the option refusals it makes before planning.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "placement/planner.h"
#include "placement/replace.h"
#include "support/errors.h"
#include "support/files.h"

namespace planner_test {

using namespace ucpkit::placement;
using ucpkit::testing::error_of;
namespace fs = std::filesystem;

namespace {

class Planner : public ::testing::Test {
 protected:
  ucpkit::testing::TempDir tmp_{"planner_test"};  // one per test, removed after it
  const fs::path dir_ = tmp_.path();
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  // 2 layers x 3 experts.
  std::string loads() { return write("loads.json", "[[30, 20, 10], [5, 5, 50]]"); }
  static PlanRequest request(const std::string& loads_path, int nodes, int gpus, int slots, int survive) {
    PlanRequest r;
    r.loads_path = loads_path;
    r.sizes.nodes = nodes;
    r.sizes.gpus_per_node = gpus;
    r.sizes.slots_per_gpu = slots;
    r.sizes.survive_node_failures = survive;
    return r;
  }
};

LoadMatrix matrix(size_t layers, size_t experts, std::vector<double> v) { return {layers, experts, std::move(v)}; }

// Distinct nodes of every expert of a layer.
std::vector<int> nodes_of(const std::vector<int>& phy2log, const Cluster& cl, int experts) {
  std::vector<std::set<int>> s(experts);
  for (size_t p = 0; p < phy2log.size(); ++p) s[phy2log[p]].insert(cl.node_of_slot(static_cast<int>(p)));
  std::vector<int> n;
  for (const auto& x : s) n.push_back(static_cast<int>(x.size()));
  return n;
}

}  // namespace

TEST(ParseIdList, ReadsCommaSeparatedIds) {
  EXPECT_EQ(parse_id_list("0,2,15", "--failed-nodes"), (std::vector<int>{0, 2, 15}));
  EXPECT_EQ(parse_id_list("7", "--failed-nodes"), (std::vector<int>{7}));
  EXPECT_EQ(parse_id_list("1, 2", "--failed-nodes"), (std::vector<int>{1, 2}));  // blanks before an id are read
}

TEST(ParseIdList, RefusesAnythingButNonNegativeIds) {
  for (const char* bad : {"a", "1,,2", "-1", "1x", "1.5", "99999999999"}) {
    const std::string msg = error_of([&] { parse_id_list(bad, "--failed-nodes"); });
    EXPECT_NE(msg.find("--failed-nodes expects non-negative node ids"), std::string::npos) << bad << ": " << msg;
    EXPECT_NE(msg.find(std::string("\"") + bad + "\""), std::string::npos) << msg;
  }
  EXPECT_NE(error_of([] { parse_id_list("", "--failed-nodes"); }).find("--failed-nodes lists no node"),
            std::string::npos);
}

// 4 experts on 2 nodes x 1 GPU x 4 slots with f = 2: 8 slots for 4 experts on 2 nodes each, so every
// expert has exactly one replica on each node.
TEST(PlanPlacement, FillsEveryFieldAndKeepsTheGuarantee) {
  const Cluster cl{2, 1, 4};
  PlacementOptions o;
  o.fault_tolerance = 2;
  const Plan p = plan_placement(matrix(1, 4, {40, 30, 20, 10}), cl, "balanced-ft", o);
  EXPECT_EQ(p.algorithm, "balanced-ft");
  EXPECT_EQ(p.experts, 4);
  EXPECT_EQ(p.fault_tolerance, 2);
  EXPECT_EQ(p.node_ids, (std::vector<int>{0, 1}));
  EXPECT_EQ(p.cluster.slots(), 8);
  ASSERT_EQ(p.layers.size(), 1u);
  ASSERT_EQ(p.layers[0].phy2log.size(), 8u);
  EXPECT_EQ(nodes_of(p.layers[0].phy2log, cl, 4), (std::vector<int>{2, 2, 2, 2}));
  EXPECT_FALSE(p.details.contains("fault_tolerance_requested"));
}

// eplb ignores f; 4 experts in 4 slots on 2 nodes sit on one node each: the plan records f = 1 and
// the request beside it.
TEST(PlanPlacement, RecordsTheGuaranteeThatHoldsWhenBelowTheRequest) {
  const Cluster cl{2, 1, 2};
  PlacementOptions o;
  o.fault_tolerance = 2;
  const Plan p = plan_placement(matrix(1, 4, {1, 2, 3, 4}), cl, "eplb", o);
  EXPECT_EQ(p.fault_tolerance, 1);
  EXPECT_EQ(p.details.at("fault_tolerance_requested"), 2);
  EXPECT_EQ(p.details.at("survives_node_failures_requested"), 1);
}

TEST(PlanPlacement, RefusesABadClusterFaultToleranceOrAlgorithm) {
  PlacementOptions o;
  const LoadMatrix w = matrix(1, 2, {1, 1});
  EXPECT_THROW(plan_placement(w, Cluster{0, 1, 2}, "balanced-ft", o), ucpkit::UsageError);
  o.fault_tolerance = 0;
  EXPECT_NE(error_of([&] {
              plan_placement(w, Cluster{1, 1, 2}, "balanced-ft", o);
            }).find("is impossible"),
            std::string::npos);
  o.fault_tolerance = 1;
  EXPECT_NE(error_of([&] {
              plan_placement(w, Cluster{1, 1, 2}, "no-such-algorithm", o);
            }).find("no-such-algorithm"),
            std::string::npos);
}

TEST_F(Planner, FreshPlanHasSummaryTableFileAndSvg) {
  PlanRequest req = request(loads(), 3, 1, 2, 1);  // 6 slots, 3 experts on 2 nodes each
  req.want_svg = true;
  req.svg_layer = 1;
  const PlanOutcome out = make_plan(req);
  EXPECT_EQ(out.plan.fault_tolerance, 2);
  EXPECT_FALSE(out.migration);
  EXPECT_FALSE(out.replacement);
  for (const auto& l : out.plan.layers)
    EXPECT_EQ(nodes_of(l.phy2log, out.plan.cluster, 3), (std::vector<int>{2, 2, 2}));
  const auto& s = out.summary;
  EXPECT_EQ(s.at("algorithm"), "balanced-ft");
  EXPECT_EQ(s.at("nodes"), 3);
  EXPECT_EQ(s.at("gpus_per_node"), 1);
  EXPECT_EQ(s.at("slots_per_gpu"), 2);
  EXPECT_EQ(s.at("layers"), 2);
  EXPECT_EQ(s.at("experts"), 3);
  EXPECT_EQ(s.at("fault_tolerance"), 2);
  EXPECT_EQ(s.at("survives_node_failures"), 1);
  EXPECT_TRUE(s.at("metrics").contains("balancedness"));
  EXPECT_FALSE(s.contains("replicas_moved"));
  EXPECT_EQ(out.table.rfind("balanced-ft on ", 0), 0u) << out.table;
  EXPECT_NE(out.table.find("2 layers x 3 experts"), std::string::npos) << out.table;
  EXPECT_NE(out.table.find("\nall "), std::string::npos) << out.table;
  const auto doc = nlohmann::json::parse(out.plan_file_text());
  EXPECT_EQ(doc.at("nodes"), 3);
  ASSERT_EQ(doc.at("layers").size(), 2u);
  EXPECT_EQ(doc.at("layers")[1].at("phy2log").get<std::vector<int>>(), out.plan.layers[1].phy2log);
  EXPECT_NE(out.svg.find("<svg"), std::string::npos);
  EXPECT_NE(out.svg.find("before: spread baseline"), std::string::npos);
  EXPECT_TRUE(out.sglang_text.empty());
  EXPECT_TRUE(out.vllm_bytes.empty());
}

// A --current plan on 3 nodes with f = 2 (each expert on 2 of them); node 0 fails: 4 slots are left
// for 3 experts, so f falls to 1 with a note, and every expert keeps a surviving replica.
TEST_F(Planner, NodeLossLowersFaultToleranceAndCountsTheMigration) {
  const std::string lp = loads();
  const PlanOutcome first = make_plan(request(lp, 3, 1, 2, 1));
  const std::string current = write("current.json", first.plan_file_text());
  PlanRequest req;
  req.loads_path = lp;
  req.current_path = current;
  req.change.failed = {0};
  const PlanOutcome out = make_plan(req);
  EXPECT_EQ(out.plan.cluster.nodes, 2);
  EXPECT_EQ(out.plan.fault_tolerance, 1);
  ASSERT_EQ(out.notes.size(), 1u);
  EXPECT_NE(out.notes[0].find("fault tolerance lowered"), std::string::npos) << out.notes[0];
  ASSERT_TRUE(out.migration);
  EXPECT_TRUE(out.migration->lost.empty());
  EXPECT_EQ(out.summary.at("node_ids"), nlohmann::json::array({1, 2}));
  EXPECT_EQ(out.summary.at("recoverable"), true);
  EXPECT_EQ(out.summary.at("replicas_moved"), out.migration->replicas_moved);
  EXPECT_EQ(out.summary.at("from_plan").at("gpus_per_node"), 1);
  EXPECT_FALSE(out.said.empty());
  EXPECT_NE(out.table.find("migration: "), std::string::npos) << out.table;
  EXPECT_TRUE(nlohmann::json::parse(out.plan_file_text()).contains("migration"));
}

TEST_F(Planner, CurrentPlanOfOtherLayersOrExpertsIsRefusedNamingIt) {
  const std::string current = write("one_layer.json",
                                    make_plan(request(write("l1.json", "[[1, 2, 3]]"), 3, 1, 2, 0)).plan_file_text());
  PlanRequest req;
  req.loads_path = loads();
  req.current_path = current;
  req.change.failed = {0};
  const std::string msg = error_of([&] { make_plan(req); });
  EXPECT_NE(msg.find(current + ": plan has 1 layers, loads have 2"), std::string::npos) << msg;
  // More experts in the plan than in the loads.
  const std::string wide = write(
      "wide.json", make_plan(request(write("l4.json", "[[1,2,3,4],[1,2,3,4]]"), 2, 1, 2, 0)).plan_file_text());
  req.current_path = wide;
  const std::string msg2 = error_of([&] { make_plan(req); });
  EXPECT_NE(msg2.find(wide + ": plan places expert ids beyond the 3 experts"), std::string::npos) << msg2;
}

// The same loads re-placed from a balanced-ft plan: the file carries the re-placement with its
// transfers written in place of the placeholder, one per copy counted.
TEST_F(Planner, PreviousPlanIsReplacedWithTransfersInTheFile) {
  const std::string lp = loads();
  const std::string prev = write("prev.json", make_plan(request(lp, 3, 1, 2, 1)).plan_file_text());
  write("new.json", "[[10, 20, 30], [50, 5, 5]]");
  PlanRequest req;
  req.loads_path = (dir_ / "new.json").string();
  req.previous_path = prev;
  const PlanOutcome out = make_plan(req);
  ASSERT_TRUE(out.replacement);
  EXPECT_EQ(out.plan.fault_tolerance, 2);  // taken from the previous plan
  EXPECT_EQ(out.plan.details.at("replaced_from"), prev);
  const auto& rep = out.summary.at("replacement");
  EXPECT_FALSE(rep.contains("transfers"));
  EXPECT_TRUE(rep.at("from_scratch").contains("eplb-global"));
  EXPECT_TRUE(rep.at("from_scratch").contains("balanced-ft"));
  const auto doc = nlohmann::json::parse(out.plan_file_text());
  const auto& transfers = doc.at("replacement").at("transfers");
  ASSERT_TRUE(transfers.is_array());
  EXPECT_EQ(static_cast<long long>(transfers.size()), out.replacement->copies);
  EXPECT_NE(out.table.find("re-placement from " + prev), std::string::npos) << out.table;
  // The previous plan must match the loads' shape.
  req.loads_path = write("l1.json", "[[1, 2, 3]]");
  const std::string msg = error_of([&] { make_plan(req); });
  EXPECT_NE(msg.find(prev + ": plan has 2 layers x 3 experts, loads have 1 x 3"), std::string::npos) << msg;
}

// Above kLargeClusterNodes with a migration weight, balanced-ft from scratch is an option only of the
// layers whose moves stall (replace.cpp): the plan says it was not placed for the comparison, and the
// same run with --report, which places it for every layer to compare, places the same replicas.
TEST_F(Planner, LargeWeightedReplacementNamesTheSkippedFromScratchPlacement) {
  const int nodes = kLargeClusterNodes + 4;
  std::string old_loads = "[[", new_loads = "[[";
  for (int e = 0; e < 16; ++e) {  // layer 0 drifts, layer 1 stays
    old_loads += std::to_string(100 + 37 * e) + (e < 15 ? ", " : "], [");
    new_loads += std::to_string(e % 3 == 0 ? 900 - 40 * e : 100 + 37 * e) + (e < 15 ? ", " : "], [");
  }
  for (int e = 0; e < 16; ++e) {
    old_loads += std::to_string(50 + 11 * e) + (e < 15 ? ", " : "]]");
    new_loads += std::to_string(50 + 11 * e) + (e < 15 ? ", " : "]]");
  }
  const std::string prev = write("prev.json",
                                 make_plan(request(write("old.json", old_loads), nodes, 1, 2, 0)).plan_file_text());
  PlanRequest req;
  req.loads_path = write("new.json", new_loads);
  req.previous_path = prev;
  req.migration_weight = 1;
  const PlanOutcome plain = make_plan(req);
  const auto& rep = plain.summary.at("replacement");
  EXPECT_FALSE(rep.at("from_scratch").contains("balanced-ft")) << rep.dump();
  EXPECT_FALSE(rep.at("from_scratch").contains("eplb-global")) << rep.dump();
  EXPECT_NE(
      rep.at("from_scratch_skipped").at("balanced-ft").get<std::string>().find("placed only where the moves stall"),
      std::string::npos)
      << rep.dump();
  EXPECT_NE(plain.table.find("from scratch, balanced-ft: not placed above"), std::string::npos) << plain.table;
  req.report = true;
  const PlanOutcome reported = make_plan(req);
  const auto& rep2 = reported.summary.at("replacement");
  EXPECT_TRUE(rep2.at("from_scratch").contains("balanced-ft")) << rep2.dump();
  EXPECT_TRUE(rep2.at("from_scratch").contains("eplb-global")) << rep2.dump();
  EXPECT_FALSE(rep2.contains("from_scratch_skipped")) << rep2.dump();
  ASSERT_EQ(plain.plan.layers.size(), reported.plan.layers.size());
  for (size_t l = 0; l < plain.plan.layers.size(); ++l)
    EXPECT_EQ(plain.plan.layers[l].phy2log, reported.plan.layers[l].phy2log) << "layer " << l;
  EXPECT_EQ(rep.at("copies_moved"), rep2.at("copies_moved"));
  EXPECT_EQ(rep.at("layers_from_scratch"), rep2.at("layers_from_scratch"));
}

TEST_F(Planner, OptionRefusalsNameTheOption) {
  const std::string lp = loads();
  auto refused = [&](const std::function<void(PlanRequest&)>& change, const std::string& words) {
    PlanRequest req = request(lp, 3, 1, 2, 1);
    change(req);
    const std::string msg = error_of([&] { make_plan(req); });
    EXPECT_NE(msg.find(words), std::string::npos) << "expected \"" << words << "\", got \"" << msg << "\"";
  };
  refused([](PlanRequest& r) { r.placement.recovery_weight = 1.5; }, "--recovery-weight must be a number from 0 to 1");
  refused([](PlanRequest& r) { r.placement.recovery_weight = 0.5, r.algorithm = "eplb"; },
          "--recovery-weight applies to balanced-ft, not --algorithm eplb");
  refused([](PlanRequest& r) { r.placement.recovery_weight = 0.5, r.previous_path = "p.json"; },
          "--recovery-weight does not apply to --previous");
  refused([](PlanRequest& r) { r.pareto = true; }, "--pareto needs --report");
  refused(
      [](PlanRequest& r) {
        r.min_recovery = MinRecovery{1, 0.5}, r.placement.recovery_weight = 0.5;
      },
      "--min-recovery and --recovery-weight are exclusive");
  refused([](PlanRequest& r) { r.min_recovery = MinRecovery{3, 0.5}; }, "k must be below the 3 nodes");
  refused([](PlanRequest& r) { r.change.failed = {0}; }, "--failed-nodes and --added-nodes need --current");
  refused([](PlanRequest& r) { r.want_svg = true, r.svg_layer = 2; },
          "--svg-layer 2 is out of range: the loads have 2 layer(s), 0..1");
  refused([](PlanRequest& r) { r.previous_path = "p.json", r.current_path = "c.json"; },
          "--previous and --current are exclusive");
  refused([](PlanRequest& r) { r.previous_path = "p.json", r.algorithm = "eplb"; }, "--algorithm eplb does not apply");
  refused([](PlanRequest& r) { r.previous_path = "p.json", r.max_moved_bytes = 10; },
          "--max-moved-bytes needs --expert-bytes");
  refused([](PlanRequest& r) { r.previous_path = "p.json", r.migration_weight = -1; },
          "--migration-weight must be a finite number >= 0");
}

TEST_F(Planner, EngineFilesAreMadeOnlyWhenAsked) {
  PlanRequest req = request(loads(), 3, 1, 2, 0);
  req.want_sglang = true;
  req.want_vllm = true;
  const PlanOutcome out = make_plan(req);
  EXPECT_FALSE(out.sglang_text.empty());
  EXPECT_TRUE(nlohmann::json::accept(out.sglang_text));
  // safetensors: an 8-byte little-endian header length, then the JSON header.
  ASSERT_GT(out.vllm_bytes.size(), 8u);
  EXPECT_EQ(out.vllm_bytes[8], '{');
}

}  // namespace planner_test
