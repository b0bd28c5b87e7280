// Fault tolerance said in node failures survived, and cluster sizes taken from the plan re-placed
// (issue 28 item 10): resolve_cluster in-process, plan files that record (or do not record) their
// fault tolerance, and moe-replace run as job scripts call it (relative paths, from another working
// directory, sizes left out where the plan gives them).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"
#include "placement/cluster_request.h"
#include "placement/plan.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"
#include "test_data.h"

namespace cluster_request_test {

namespace fs = std::filesystem;
using namespace ucpkit::placement;
using ucpkit::testing::error_of;

namespace {

// The message of the UsageError `f` throws ("" when none).
std::string usage_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ucpkit::UsageError& e) {
    return e.what();
  }
  return "";
}

const char* kLoads = "[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]";

// The fewest distinct nodes any expert of any layer of a plan file sits on, from phy2log alone.
int fewest_nodes(const nlohmann::json& plan) {
  const int per_node = plan["gpus_per_node"].get<int>() * plan["slots_per_gpu"].get<int>();
  int least = 1 << 30;
  for (const auto& layer : plan["layers"]) {
    std::map<int, std::set<int>> nodes;
    const auto p2l = layer["phy2log"].get<std::vector<int>>();
    for (size_t p = 0; p < p2l.size(); ++p) nodes[p2l[p]].insert(static_cast<int>(p) / per_node);
    for (const auto& [e, n] : nodes) least = std::min(least, static_cast<int>(n.size()));
  }
  return least;
}

// A scratch folder with in/loads.json; the tool runs from work/ with relative paths.
class SurviveCli : public ::testing::Test {
 protected:
  void SetUp() override {
    bin = placement_test::tool_dir() + "/moe-replace";
    if (!fs::exists(bin)) GTEST_SKIP() << bin << " not built";
    root = ucpkit::testing::scratch_dir(std::string("survive_") +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(fs::path(root) / "in");
    fs::create_directories(fs::path(root) / "work");
    std::ofstream(fs::path(root) / "in" / "loads.json") << kLoads;
  }
  // Exit status; stdout and stderr together in *out.
  int run(const std::string& args, std::string* out) {
    return ucpkit::testing::run_command_status("cd " + ucpkit::testing::quote(root + "/work") + " && " +
                                                   ucpkit::testing::quote(bin) + " --loads ../in/loads.json " + args,
                                               out);
  }
  nlohmann::json read(const std::string& rel) {
    return nlohmann::json::parse(ucpkit::testing::file_bytes(root + "/work/" + rel));
  }
  bool exists(const std::string& rel) { return fs::exists(fs::path(root) / "work" / rel); }
  std::string bin, root;
};

}  // namespace

TEST(ClusterRequest, SurviveNodeFailuresIsFaultToleranceMinusOne) {
  ClusterRequest r;
  r.nodes = 4, r.gpus_per_node = 2, r.slots_per_gpu = 3;
  EXPECT_EQ(resolve_cluster(r).fault_tolerance, 1);  // the default: K = 0
  r.survive_node_failures = 2;
  EXPECT_EQ(resolve_cluster(r).fault_tolerance, 3);
  r.fault_tolerance = 3;  // both spellings, agreeing
  EXPECT_EQ(resolve_cluster(r).fault_tolerance, 3);
  r.fault_tolerance = 2;
  const std::string both = usage_error_of([&] { resolve_cluster(r); });
  EXPECT_NE(both.find("--survive-node-failures 2 and --fault-tolerance 2 disagree"), std::string::npos) << both;
  r.survive_node_failures.reset();
  EXPECT_EQ(resolve_cluster(r).fault_tolerance, 2);
  r.fault_tolerance = 0;
  EXPECT_NE(usage_error_of([&] { resolve_cluster(r); }).find("--fault-tolerance must be at least 1"), std::string::npos);
  r.fault_tolerance.reset();
  r.survive_node_failures = -1;
  EXPECT_NE(usage_error_of([&] { resolve_cluster(r); }).find("--survive-node-failures must be at least 0"),
            std::string::npos);
  EXPECT_EQ(fault_tolerance_option(3), "--survive-node-failures 2 (--fault-tolerance 3)");
  EXPECT_EQ(survives_text(2), "survives 1 node failure");
  EXPECT_EQ(survives_text(1), "survives 0 node failures");
}

TEST(ClusterRequest, SizesComeFromTheBasePlanAndDisagreementNamesBoth) {
  Plan plan;
  plan.cluster = {4, 2, 3};
  plan.fault_tolerance = 2;
  ClusterRequest r;
  const ResolvedCluster taken = resolve_cluster(r, {&plan, "--current", "plan.json"});
  EXPECT_EQ(taken.cluster.nodes, 4);
  EXPECT_EQ(taken.cluster.gpus_per_node, 2);
  EXPECT_EQ(taken.cluster.slots_per_gpu, 3);
  EXPECT_EQ(taken.fault_tolerance, 2);
  EXPECT_EQ(taken.from_plan, nlohmann::json::parse(
                                 R"({"nodes":4,"gpus_per_node":2,"slots_per_gpu":3,"survives_node_failures":1})"));
  EXPECT_NE(taken.said.find("from --current plan.json"), std::string::npos) << taken.said;
  // Given and equal: not "taken"; a fault tolerance given replaces the plan's.
  r.nodes = 4;
  r.survive_node_failures = 0;
  const ResolvedCluster given = resolve_cluster(r, {&plan, "--current", "plan.json"});
  EXPECT_EQ(given.fault_tolerance, 1);
  EXPECT_FALSE(given.from_plan.contains("nodes"));
  EXPECT_FALSE(given.from_plan.contains("survives_node_failures"));
  // Given and different: a usage error naming the option, the value, the plan and its value.
  r.gpus_per_node = 8;
  try {
    resolve_cluster(r, {&plan, "--previous", "old.json"});
    FAIL() << "no error";
  } catch (const ucpkit::UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--gpus-per-node 8 disagrees with --previous old.json, which has 2 GPUs per node"),
              std::string::npos) << m;
    EXPECT_NE(m.find("--current old.json --failed-nodes"), std::string::npos) << m;  // where node loss goes
  }
  // Without a base plan every size is required.
  ClusterRequest none;
  none.nodes = 2, none.gpus_per_node = 2;
  const std::string missing = usage_error_of([&] { resolve_cluster(none); });
  EXPECT_NE(missing.find("--slots-per-gpu is required"), std::string::npos) << missing;
}

TEST(ClusterRequest, PlanFilesRecordTheirFaultToleranceOrTheOneTheyHold) {
  // 2 nodes x 1 GPU x 2 slots, two experts: expert 0 on both nodes, expert 1 on node 1 only.
  nlohmann::json doc = nlohmann::json::parse(R"({"nodes":2,"gpus_per_node":1,"slots_per_gpu":2,
                                                  "layers":[{"phy2log":[0,0,0,1]}]})");
  EXPECT_EQ(plan_from_json(doc, "p.json").fault_tolerance, 1);  // neither key: what the placement holds
  doc["layers"][0]["phy2log"] = {0, 1, 1, 0};
  EXPECT_EQ(plan_from_json(doc, "p.json").fault_tolerance, 2);
  doc["survives_node_failures"] = 0;
  EXPECT_EQ(plan_from_json(doc, "p.json").fault_tolerance, 1);
  doc["fault_tolerance"] = 2;  // "fault_tolerance" first
  EXPECT_EQ(plan_from_json(doc, "p.json").fault_tolerance, 2);
  doc["layers"][0]["phy2log"] = {0, 0, 0, 1};
  const std::string m = error_of([&] { plan_from_json(doc, "p.json"); });
  EXPECT_NE(m.find("p.json"), std::string::npos) << m;
  EXPECT_NE(m.find("records fault_tolerance 2"), std::string::npos) << m;
}

TEST_F(SurviveCli, PlanAndSummarySaySurvivedNodeFailures) {
  std::string out;
  ASSERT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --survive-node-failures 1 --output k1.json", &out), 0)
      << out;
  EXPECT_NE(out.find("survives 1 node failure (f=2)"), std::string::npos) << out;
  const nlohmann::json k1 = read("k1.json");
  EXPECT_EQ(k1["survives_node_failures"], 1);
  EXPECT_EQ(k1["fault_tolerance"], 2);
  EXPECT_GE(fewest_nodes(k1), 2);  // any one node may fail
  EXPECT_EQ(k1["metrics"]["recovery_probability"]["1"], 1.0);
  // The old spelling, F = K + 1, plans the same.
  ASSERT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 --output f2.json -q", &out), 0)
      << out;
  const nlohmann::json f2 = read("f2.json");
  for (size_t l = 0; l < k1["layers"].size(); ++l) EXPECT_EQ(k1["layers"][l]["phy2log"], f2["layers"][l]["phy2log"]);
  // The default survives no node failure, and the --json summary says so.
  ASSERT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --output k0.json --json", &out), 0) << out;
  const nlohmann::json s = nlohmann::json::parse(out);
  EXPECT_EQ(s["survives_node_failures"], 0);
  EXPECT_EQ(read("k0.json")["survives_node_failures"], 0);
  // An impossible K and disagreeing spellings: usage errors naming the option typed.
  EXPECT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --survive-node-failures 4 --output x.json", &out), 2);
  EXPECT_NE(out.find("--survive-node-failures 4"), std::string::npos) << out;
  EXPECT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --survive-node-failures 1 --fault-tolerance 1 "
                "--output x.json",
                &out),
            2);
  EXPECT_NE(out.find("disagree"), std::string::npos) << out;
  EXPECT_FALSE(exists("x.json"));
}

TEST_F(SurviveCli, CurrentPlanGivesTheSizesAndTheFaultTolerance) {
  std::string out;
  // The plan made with the old spelling (--fault-tolerance 2 = --survive-node-failures 1).
  ASSERT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 --output plan.json -q", &out), 0)
      << out;
  // Node 2 lost: no size restated.
  ASSERT_EQ(run("--current plan.json --failed-nodes 2 --output next.json --json", &out), 0) << out;
  EXPECT_NE(out.find("moe-replace: from --current plan.json: --nodes 4, --gpus-per-node 4, --slots-per-gpu 2, "
                     "--survive-node-failures 1"),
            std::string::npos)
      << out;
  const nlohmann::json next = read("next.json");
  EXPECT_EQ(next["nodes"], 3);
  EXPECT_EQ(next["gpus_per_node"], 4);
  EXPECT_EQ(next["slots_per_gpu"], 2);
  EXPECT_EQ(next["node_ids"], nlohmann::json::parse("[0, 1, 3]"));
  EXPECT_EQ(next["survives_node_failures"], 1);  // kept, not reset to the fresh-plan default
  EXPECT_GE(fewest_nodes(next), 2);
  const nlohmann::json s = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(s["from_plan"]["nodes"], 4);
  EXPECT_EQ(s["from_plan"]["survives_node_failures"], 1);
  // A node added, sizes given and equal to the plan's: nothing said to be taken but K.
  ASSERT_EQ(run("--current plan.json --nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --added-nodes 1 --output add.json",
                &out),
            0)
      << out;
  EXPECT_EQ(read("add.json")["nodes"], 5);
  EXPECT_NE(out.find("from --current plan.json: --survive-node-failures 1"), std::string::npos) << out;
  // A size that disagrees with the plan: exit 2 naming both values, and where node loss goes.
  EXPECT_EQ(run("--current plan.json --nodes 3 --failed-nodes 2 --output bad.json", &out), 2) << out;
  EXPECT_NE(out.find("--nodes 3 disagrees with --current plan.json, which has 4 nodes"), std::string::npos) << out;
  EXPECT_NE(out.find("--failed-nodes"), std::string::npos) << out;
  EXPECT_FALSE(exists("bad.json"));
  // No plan and no sizes.
  EXPECT_EQ(run("--output bad.json", &out), 2) << out;
  EXPECT_NE(out.find("--nodes is required"), std::string::npos) << out;
  EXPECT_FALSE(exists("bad.json"));
}

TEST_F(SurviveCli, PreviousSizeErrorPointsToCurrentAndFailedNodes) {
  std::string out;
  ASSERT_EQ(run("--nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 --output prev.json -q", &out), 0)
      << out;
  // Sizes left out: the previous plan's cluster and K.
  ASSERT_EQ(run("--previous prev.json --output same.json -q", &out), 0) << out;
  const nlohmann::json same = read("same.json");
  EXPECT_EQ(same["nodes"], 4);
  EXPECT_EQ(same["survives_node_failures"], 1);
  EXPECT_GE(fewest_nodes(same), 2);
  // One node fewer under --previous: the error says node loss is --current ... --failed-nodes.
  EXPECT_EQ(run("--previous prev.json --nodes 3 --output bad.json", &out), 2) << out;
  EXPECT_NE(out.find("moe-replace: error: --nodes 3 disagrees with --previous prev.json, which has 4 nodes"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("--current prev.json --failed-nodes"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_FALSE(exists("bad.json"));
}

}  // namespace cluster_request_test
