// The plan and its JSON (lib/placement/plan.cpp): metrics of a small layer by hand, the plan text
// (padded log2phy, counts, extra keys, raw values, pieces), guaranteed_fault_tolerance, plan_from_json
// and read_plan round trips on a hand-made plan, and the errors on damaged plan JSON naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "placement/plan.h"
#include "support/errors.h"
#include "support/files.h"

namespace plan_test {

using namespace ucpkit::placement;
using ucpkit::testing::error_of;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// 2 nodes x 1 GPU x 3 slots: node 0 holds experts {0, 1, 2}, node 1 {0, 1, 0}. Loads {9, 4, 2}:
// shares 3, 2, 2; GPU loads 7 and 8 (mean 7.5, balancedness 0.9375). One node down loses expert 2
// when it is node 0, nothing when it is node 1: p(1) = 0.5.
Plan small_plan() {
  Plan p;
  p.cluster = {2, 1, 3};
  p.algorithm = "hand";
  p.experts = 3;
  p.fault_tolerance = 1;
  p.layers.push_back({{0, 1, 2, 0, 1, 0}, {0, 0, 0, 1, 1, 2}});
  p.node_ids = {4, 7};
  compute_metrics(p, LoadMatrix{1, 3, {9, 4, 2}}, RecoveryOptions{});
  return p;
}

class PlanFile : public ::testing::Test {
 protected:
  ucpkit::testing::TempDir tmp_{"plan_test"};  // one per test, removed after it
  const fs::path dir_ = tmp_.path();
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
};

// small_plan as a plan file holds it (without log2phy and metrics), for damaging one key at a time.
json small_doc() {
  return json{
      {"nodes", 2},   {"gpus_per_node", 1}, {"slots_per_gpu", 3},   {"algorithm", "hand"},
      {"experts", 3}, {"node_ids", {4, 7}}, {"fault_tolerance", 1}, {"layers", {{{"phy2log", {0, 1, 2, 0, 1, 0}}}}}};
}

}  // namespace

TEST(PlanMetrics, GpuLoadsBalancednessAndRecoveryByHand) {
  const Plan p = small_plan();
  ASSERT_EQ(p.layer_metrics.size(), 1u);
  const LayerMetrics& m = p.layer_metrics[0];
  EXPECT_EQ(m.gpu_loads, (std::vector<double>{7, 8}));
  EXPECT_EQ(m.mean_load, 7.5);
  EXPECT_EQ(m.max_load, 8.0);
  EXPECT_DOUBLE_EQ(m.balancedness, 0.9375);
  ASSERT_EQ(m.recovery.size(), 1u);  // k up to nodes - 1
  EXPECT_EQ(m.recovery[0].failed_nodes, 1);
  EXPECT_TRUE(m.recovery[0].exact);
  EXPECT_DOUBLE_EQ(m.recovery[0].probability, 0.5);
  EXPECT_DOUBLE_EQ(p.metrics.balancedness, 0.9375);
  EXPECT_DOUBLE_EQ(p.metrics.min_balancedness, 0.9375);
  ASSERT_EQ(p.metrics.recovery.size(), 1u);
  EXPECT_DOUBLE_EQ(p.metrics.recovery[0].probability, 0.5);
}

// Two layers: sums of means over sums of maxima, not the mean of the ratios.
TEST(PlanMetrics, OverallBalancednessIsSumOfMeansOverSumOfMaxima) {
  Plan p;
  p.cluster = {1, 2, 1};
  p.experts = 2;
  p.layers = {{{0, 1}, {0, 0}}, {{0, 1}, {0, 0}}};
  compute_metrics(p, LoadMatrix{2, 2, {1, 3, 5, 5}}, RecoveryOptions{});
  EXPECT_DOUBLE_EQ(p.layer_metrics[0].balancedness, 2.0 / 3);
  EXPECT_DOUBLE_EQ(p.layer_metrics[1].balancedness, 1.0);
  EXPECT_DOUBLE_EQ(p.metrics.balancedness, (2.0 + 5.0) / (3.0 + 5.0));
  EXPECT_DOUBLE_EQ(p.metrics.min_balancedness, 2.0 / 3);
  EXPECT_TRUE(p.metrics.recovery.empty());  // one node: no k to evaluate
}

TEST(PlanJson, TextHoldsSizesMapsCountsAndMetrics) {
  const Plan p = small_plan();
  const std::string text = plan_json_text(p);
  EXPECT_EQ(text.back(), '\n');
  const json doc = json::parse(text);
  EXPECT_EQ(doc.at("nodes"), 2);
  EXPECT_EQ(doc.at("gpus_per_node"), 1);
  EXPECT_EQ(doc.at("slots_per_gpu"), 3);
  EXPECT_EQ(doc.at("algorithm"), "hand");
  EXPECT_EQ(doc.at("experts"), 3);
  EXPECT_EQ(doc.at("fault_tolerance"), 1);
  EXPECT_EQ(doc.at("survives_node_failures"), 0);
  EXPECT_EQ(doc.at("node_ids"), json({4, 7}));
  ASSERT_EQ(doc.at("layers").size(), 1u);
  const json& l = doc["layers"][0];
  EXPECT_EQ(l.at("phy2log"), json({0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(l.at("log2phy"), json({{0, 3, 5}, {1, 4, -1}, {2, -1, -1}}));  // padded to the most replicas
  EXPECT_EQ(l.at("logcnt"), json({3, 2, 1}));
  EXPECT_EQ(l.at("gpu_loads"), json({7.0, 8.0}));
  EXPECT_EQ(l.at("max_gpu_load"), 8.0);
  EXPECT_EQ(l.at("mean_gpu_load"), 7.5);
  EXPECT_EQ(l.at("recovery_probability").at("1"), 0.5);
  EXPECT_EQ(l.at("recovery_method").at("1").at("method"), "exact");
  const json& m = doc.at("metrics");
  EXPECT_EQ(m.at("balancedness"), 0.9375);
  EXPECT_EQ(m.at("recovery_probability").at("1"), 0.5);
  EXPECT_EQ(m.at("monte_carlo").at("samples"), 100000);
  EXPECT_EQ(m.at("monte_carlo").at("seed"), 1);
  EXPECT_EQ(plan_to_json(p), doc);
}

TEST(PlanJson, DetailsExtraKeysAndRawValuesGoAtTheTop) {
  Plan p = small_plan();
  p.details["replaced_from"] = "old.json";
  const json extra = {{"migration", {{"moved", 3}}}, {"transfers", "@transfers"}};
  const json doc = json::parse(plan_json_text(p, extra, {{"\"@transfers\"", "[[0,1],[2,3]]"}}));
  EXPECT_EQ(doc.at("replaced_from"), "old.json");
  EXPECT_EQ(doc.at("migration").at("moved"), 3);
  EXPECT_EQ(doc.at("transfers"), json({{0, 1}, {2, 3}}));
  // A raw value whose placeholder is not in the text is not written.
  const json doc2 = json::parse(plan_json_text(p, json::object(), {{"\"@absent\"", "[1]"}}));
  EXPECT_FALSE(doc2.contains("transfers"));
}

// A phyrank that is not by appearance: log2phy lists the slots in rank order, and a rank at or above
// the expert's count (but below the width) keeps its place in the row.
TEST(PlanJson, Log2phyFollowsTheRanks) {
  Plan p;
  p.cluster = {1, 1, 4};
  p.experts = 3;
  p.layers.push_back({{0, 1, 0, 2}, {1, 1, 0, 0}});
  const json doc = json::parse(plan_json_text(p));
  EXPECT_EQ(doc["layers"][0].at("log2phy"), json({{2, 0}, {-1, 1}, {3, -1}}));
  EXPECT_FALSE(doc.contains("node_ids"));                // none in the plan: none written
  EXPECT_FALSE(doc["layers"][0].contains("gpu_loads"));  // no metrics: no per-layer metrics
}

// Pieces of at least `chunk` bytes but the last; a padding of 4 KB or more goes as a piece of its own.
TEST(PlanJson, WrittenInPiecesWithLongPaddingAlone) {
  Plan p;
  p.cluster = {1, 1, 1502};
  p.experts = 3;
  std::vector<int> phy(1502, 0);
  phy[1500] = 1, phy[1501] = 2;
  p.layers.push_back({phy, ranks_by_appearance(phy, 3)});
  std::vector<std::string> pieces;
  write_plan_json(
      p, json::object(), {}, [&](std::string_view s) { pieces.emplace_back(s); }, 256);
  std::string whole;
  for (const auto& s : pieces) whole += s;
  std::string pad;
  for (int i = 0; i < 1499; ++i) pad += ",-1";  // 4,497 bytes: experts 1 and 2 have 1 of 1,500
  int pads = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i] == pad) ++pads;
    else if (i + 1 < pieces.size() && pieces[i + 1] != pad) EXPECT_GE(pieces[i].size(), 256u) << i;
  }
  EXPECT_EQ(pads, 2);
  const json doc = json::parse(whole);
  const json& row = doc["layers"][0]["log2phy"][1];
  ASSERT_EQ(row.size(), 1500u);
  EXPECT_EQ(row[0], 1500);
  EXPECT_EQ(row[1499], -1);
  EXPECT_EQ(doc["layers"][0]["logcnt"], json({1500, 1, 1}));
}

TEST(PlanJson, GuaranteedFaultToleranceIsTheFewestNodesOfAnyExpert) {
  Plan p;
  p.cluster = {3, 1, 2};
  p.experts = 3;
  EXPECT_EQ(guaranteed_fault_tolerance(p), 3);   // no layers: every node
  p.layers.push_back({{0, 1, 0, 2, 1, 2}, {}});  // every expert on 2 nodes
  EXPECT_EQ(guaranteed_fault_tolerance(p), 2);
  p.layers.push_back({{0, 0, 1, 1, 2, 2}, {}});  // every expert on 1 node
  EXPECT_EQ(guaranteed_fault_tolerance(p), 1);
}

TEST(PlanFromJson, ReadsEveryKeyOfAHandMadePlan) {
  const Plan p = plan_from_json(small_doc(), "plan.json");
  EXPECT_EQ(p.cluster.nodes, 2);
  EXPECT_EQ(p.cluster.gpus_per_node, 1);
  EXPECT_EQ(p.cluster.slots_per_gpu, 3);
  EXPECT_EQ(p.algorithm, "hand");
  EXPECT_EQ(p.experts, 3);
  EXPECT_EQ(p.node_ids, (std::vector<int>{4, 7}));
  EXPECT_EQ(p.fault_tolerance, 1);
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_EQ(p.layers[0].phy2log, (std::vector<int>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(p.layers[0].phyrank, (std::vector<int>{0, 0, 0, 1, 1, 2}));
}

TEST(PlanFromJson, DefaultsForKeysAnotherToolLeavesOut) {
  json doc = small_doc();
  doc.erase("algorithm"), doc.erase("experts"), doc.erase("node_ids"), doc.erase("fault_tolerance");
  doc["layers"][0]["phy2log"] = {0, 1, 2, 2, 1, 0};  // every expert on both nodes
  Plan p = plan_from_json(doc, "plan.json");
  EXPECT_EQ(p.algorithm, "unknown");
  EXPECT_EQ(p.experts, 3);                          // the largest id + 1
  EXPECT_EQ(p.node_ids, (std::vector<int>{0, 1}));  // identity
  EXPECT_EQ(p.fault_tolerance, 2);                  // what the placement guarantees
  doc["survives_node_failures"] = 0;                // K = 0: f = 1
  EXPECT_EQ(plan_from_json(doc, "plan.json").fault_tolerance, 1);
  // Experts past the largest id have no replica: no node, so even f = 1 does not hold.
  doc["experts"] = 5;
  EXPECT_NE(error_of([&] { plan_from_json(doc, "plan.json"); }).find("some expert sits on only 0 node(s)"),
            std::string::npos);
}

TEST(PlanFromJson, DamagedPlansAreRefusedNamingTheFileAndKey) {
  auto refused = [](const std::function<void(json&)>& damage, const std::string& words) {
    json doc = small_doc();
    damage(doc);
    const std::string msg = error_of([&] { plan_from_json(doc, "p.json"); }, "(accepted)");
    EXPECT_EQ(msg.rfind("p.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << "expected \"" << words << "\", got \"" << msg << "\"";
  };
  refused([](json& d) { d = json::array({1}); }, "a plan must be a JSON object");
  refused([](json& d) { d.erase("gpus_per_node"); }, "plan lacks \"gpus_per_node\"");
  refused([](json& d) { d.erase("layers"); }, "plan lacks \"layers\"");
  refused([](json& d) { d["nodes"] = 0; }, "\"nodes\" must be an integer");
  refused([](json& d) { d["slots_per_gpu"] = "3"; }, "\"slots_per_gpu\" must be an integer");
  refused([](json& d) { d["nodes"] = 100000, d["gpus_per_node"] = 100000; }, "plan cluster too large");
  refused([](json& d) { d["algorithm"] = 5; }, "\"algorithm\" must be a string");
  refused([](json& d) { d["layers"] = 1; }, "\"layers\" must be a list");
  refused([](json& d) { d["layers"] = json::array(); }, "plan has no layers");
  refused([](json& d) { d["layers"][0] = {{"log2phy", {1}}}; }, "layers[0] must be an object with \"phy2log\"");
  refused([](json& d) { d["layers"][0]["phy2log"] = {0, 1, 2}; }, "layers[0].phy2log has 3 slots, expected 6");
  refused([](json& d) { d["layers"][0]["phy2log"][4] = -1; }, "layers[0].phy2log[4] must be an integer");
  refused([](json& d) { d["experts"] = 2; }, "phy2log holds an expert id beyond \"experts\"");
  refused([](json& d) { d["node_ids"] = {4}; }, "node_ids does not list every node");
  refused([](json& d) { d["node_ids"] = {4, "x"}; }, "node_ids[1] must be an integer");
  refused([](json& d) { d["fault_tolerance"] = 2; }, "records fault_tolerance 2");
  refused([](json& d) { d.erase("fault_tolerance"), d["survives_node_failures"] = 1; }, "records fault_tolerance 2");
}

TEST_F(PlanFile, ReadPlanRoundTripsTheWrittenText) {
  const Plan p = small_plan();
  const Plan back = read_plan(write("plan.json", plan_json_text(p)));
  EXPECT_EQ(back.cluster.slots(), 6);
  EXPECT_EQ(back.algorithm, "hand");
  EXPECT_EQ(back.experts, 3);
  EXPECT_EQ(back.node_ids, (std::vector<int>{4, 7}));
  EXPECT_EQ(back.fault_tolerance, 1);
  ASSERT_EQ(back.layers.size(), 1u);
  EXPECT_EQ(back.layers[0].phy2log, (std::vector<int>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(back.layers[0].phyrank, (std::vector<int>{0, 0, 0, 1, 1, 2}));
  // Pretty-printed with a transfers list: read through the full parse, which skips it.
  json doc = small_doc();
  doc["transfers"] = {{1, 2}};
  const Plan pretty = read_plan(write("pretty.json", doc.dump(2)));
  EXPECT_EQ(pretty.node_ids, (std::vector<int>{4, 7}));
  EXPECT_EQ(pretty.layers[0].phy2log, (std::vector<int>{0, 1, 2, 0, 1, 0}));
}

TEST_F(PlanFile, DamagedPlanFilesAreRefusedNamingTheFile) {
  const std::string text = plan_json_text(small_plan());
  const std::string cut = write("cut.json", text.substr(0, text.size() / 2));
  std::string msg = error_of([&] { read_plan(cut); });
  EXPECT_EQ(msg.rfind(cut + ": not valid JSON", 0), 0u) << msg;
  const std::string deep = write("deep.json", std::string(100, '[') + std::string(100, ']'));
  msg = error_of([&] { read_plan(deep); });
  EXPECT_NE(msg.find(deep + ": JSON nested deeper than 64 levels"), std::string::npos) << msg;
  json doc = small_doc();
  doc["layers"][0]["phy2log"] = {0, 1, 2};
  const std::string short_row = write("short.json", doc.dump());
  msg = error_of([&] { read_plan(short_row); });
  EXPECT_EQ(msg, short_row + ": layers[0].phy2log has 3 slots, expected 6");
  const std::string missing = (dir_ / "missing.json").string();
  msg = error_of([&] { read_plan(missing); }, "(accepted)");
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
}

}  // namespace plan_test
