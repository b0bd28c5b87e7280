// moe-replace as job scripts call it: exit codes, plan keys, no output left behind on errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "test_data.h"

namespace cli_test {

namespace fs = std::filesystem;

namespace {

std::string binary() {
  std::string dir = placement_test::tool_dir();
  return dir.empty() ? std::string() : dir + "/moe-replace";
}

struct CliRun {
  int rc;
  std::string out;
};

CliRun run(const std::string& args) {
  fs::path log = fs::temp_directory_path() / ("moe_replace_cli_" + std::to_string(::getpid()) + ".log");
  std::string cmd = binary() + " " + args + " > " + log.string() + " 2>&1";
  int status = std::system(cmd.c_str());
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  fs::remove(log);
  return {WEXITSTATUS(status), ss.str()};
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (binary().empty() || !fs::exists(binary())) GTEST_SKIP() << "UCPKIT_BIN/moe-replace not built";
    dir = fs::temp_directory_path() / ("moe_replace_cli_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
    write("loads.json", "[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]");
  }
  void TearDown() override {
    if (!dir.empty()) fs::remove_all(dir);
  }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; }
  std::string p(const std::string& name) const { return (dir / name).string(); }
  // 4 nodes x 4 GPUs x 2 slots, f = 2, then a re-placement of plan.json with `change` into next.json.
  CliRun replace_after(const std::string& change) {
    const std::string cluster = " --nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 ";
    CliRun first = run("--loads " + p("loads.json") + cluster + "--output " + p("plan.json") + " -q");
    if (first.rc != 0) return first;
    return run("--loads " + p("loads.json") + cluster + "--current " + p("plan.json") + " " + change + " --output " +
               p("next.json"));
  }
  nlohmann::json read(const std::string& name) const {
    std::ifstream in(dir / name);
    return nlohmann::json::parse(in);
  }
  fs::path dir;
};

}  // namespace

TEST_F(Cli, WritesPlanWithContractKeys) {
  CliRun r = run("--loads " + p("loads.json") + " --nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 " +
              "--output " + p("plan.json") + " --svg " + p("plan.svg"));
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json plan = read("plan.json");
  EXPECT_EQ(plan["nodes"], 4);
  EXPECT_EQ(plan["gpus_per_node"], 4);
  EXPECT_EQ(plan["slots_per_gpu"], 2);
  EXPECT_EQ(plan["algorithm"], "balanced-ft");  // the default
  ASSERT_EQ(plan["layers"].size(), 2u);
  for (const auto& L : plan["layers"]) {
    EXPECT_EQ(L["phy2log"].size(), 32u);
    EXPECT_EQ(L["logcnt"].size(), 12u);
    EXPECT_EQ(L["log2phy"].size(), 12u);
    EXPECT_TRUE(L["balancedness"].is_number());
    EXPECT_EQ(L["recovery_probability"]["1"], 1.0);
  }
  EXPECT_TRUE(plan["metrics"]["balancedness"].is_number());
  EXPECT_TRUE(plan["metrics"]["min_balancedness"].is_number());
  EXPECT_TRUE(plan["metrics"]["recovery_probability"].contains("1"));
  EXPECT_TRUE(fs::exists(dir / "plan.svg"));
  EXPECT_NE(r.out.find("balancedness"), std::string::npos);
}

TEST_F(Cli, JsonSummaryAndEplb) {
  CliRun r = run("--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --groups 4 " +
              "--algorithm eplb --output " + p("eplb.json") + " --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["algorithm"], "eplb");
  nlohmann::json plan = read("eplb.json");
  EXPECT_EQ(plan["layers"][0]["phy2log"],
            nlohmann::json::parse("[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1]"));
}

TEST_F(Cli, FaultToleranceNotGuaranteedIsWarnedAndRecorded) {
  // eplb ignores f: a warning, and the plan records the guarantee that holds (every expert of the
  // example sits on at least one node; some on exactly one), with the request beside it.
  CliRun r = run("--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --groups 4 " +
                 "--algorithm eplb --fault-tolerance 2 --output " + p("eplb.json"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("moe-replace: warning: eplb does not guarantee --survive-node-failures 1 (--fault-tolerance 2)"), std::string::npos) << r.out;
  nlohmann::json plan = read("eplb.json");
  EXPECT_EQ(plan["fault_tolerance"], 1);
  EXPECT_EQ(plan["fault_tolerance_requested"], 2);
  // lazarus guarantees it: no warning, no extra key.
  r = run("--loads " + p("loads.json") + " --nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 " +
          "--output " + p("plan.json"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
  plan = read("plan.json");
  EXPECT_EQ(plan["fault_tolerance"], 2);
  EXPECT_FALSE(plan.contains("fault_tolerance_requested"));
}

TEST_F(Cli, ReplacementAfterFailure) {
  CliRun r = replace_after("--failed-nodes 2 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json next = read("next.json");
  EXPECT_EQ(next["nodes"], 3);
  EXPECT_EQ(next["node_ids"], nlohmann::json::parse("[0, 1, 3]"));
  EXPECT_TRUE(next["migration"]["recoverable"].get<bool>());
  for (const auto& t : next["migration"]["transfers"]) EXPECT_NE(t["from"], 2);
}

TEST_F(Cli, SvgAfterFailureDrawsEveryGpuByPhysicalNode) {
  CliRun r = replace_after("--failed-nodes 1 --svg " + p("next.svg") + " -q");
  ASSERT_EQ(r.rc, 0) << r.out;
  std::ifstream in(dir / "next.svg");
  std::string svg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = svg.find(what); at != std::string::npos; at = svg.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("class=\"before\""), 16u);  // all 4 current nodes x 4 GPUs
  EXPECT_EQ(count("class=\"after\""), 12u);   // the 3 surviving nodes
  EXPECT_EQ(count("class=\"failed\""), 1u);
  EXPECT_EQ(count("before: node 1 GPU 3:"), 1u);
  EXPECT_EQ(count("after: node 1 GPU"), 0u);
  // Bars of one physical node sit together: node 2's after bar follows node 2's before bar.
  size_t b2 = svg.find("before: node 2 GPU 0:"), a2 = svg.find("after: node 2 GPU 0:"), b3 = svg.find("before: node 3 GPU 0:");
  ASSERT_NE(b2, std::string::npos);
  ASSERT_NE(a2, std::string::npos);
  EXPECT_LT(b2, a2);
  EXPECT_LT(a2, b3);
}

TEST_F(Cli, BadInputFailsCleanly) {
  write("ragged.json", "[[1,2,3],[4,5]]");
  write("neg.json", "[[1,-2,3]]");
  write("nan.csv", "1,nan,3\n");
  struct Case {
    std::string args;
    int rc;
  } cases[] = {
      {"--loads " + p("ragged.json") + " --nodes 2 --gpus-per-node 1 --slots-per-gpu 4", 1},
      {"--loads " + p("neg.json") + " --nodes 2 --gpus-per-node 1 --slots-per-gpu 4", 1},
      {"--loads " + p("nan.csv") + " --nodes 2 --gpus-per-node 1 --slots-per-gpu 4", 1},
      {"--loads " + p("missing.json") + " --nodes 2 --gpus-per-node 1 --slots-per-gpu 4", 1},
      {"--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 1 --slots-per-gpu 4", 2},  // 12 experts, 8 slots
      {"--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2", 2},
      {"--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --algorithm nope", 2},
      {"--loads " + p("loads.json") + " --nodes 0 --gpus-per-node 4 --slots-per-gpu 2", 2},
      {"--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4", 2},
  };
  for (const auto& c : cases) {
    CliRun r = run(c.args + " --output " + p("out.json"));
    EXPECT_EQ(r.rc, c.rc) << c.args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(dir / "out.json")) << c.args;
    EXPECT_NE(r.out.find("moe-replace: error:"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
  // An output folder that does not exist, or is a file: named for what it is, exit 1, nothing made.
  write("file", "x");
  for (const auto& [out, says] : {std::pair<std::string, std::string>{p("no/such/plan.json"), "folder " + p("no/such") +
                                                                           " does not exist (create it first)"},
                                  {p("file/plan.json"), "folder " + p("file") + " is not a folder"}}) {
    CliRun r = run("--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --output " + out);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  }
  EXPECT_FALSE(fs::exists(dir / "no"));
  // Failed node not in the plan.
  ASSERT_EQ(run("--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --output " + p("plan.json") + " -q").rc, 0);
  CliRun r = run("--loads " + p("loads.json") + " --nodes 2 --gpus-per-node 4 --slots-per-gpu 2 --current " + p("plan.json") +
              " --failed-nodes 7 --output " + p("out.json"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("failed node 7 is not in the current plan"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "out.json"));
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp") != std::string::npos) left.push_back(entry.path().string());
  EXPECT_TRUE(left.empty());
}

TEST_F(Cli, HelpAndVersion) {
  EXPECT_EQ(run("--help").rc, 0);
  CliRun v = run("--version");
  EXPECT_EQ(v.rc, 0);
  EXPECT_NE(v.out.find("moe-replace"), std::string::npos);
}

TEST_F(Cli, SmartMoeLoadsAllAlgorithms) {
  std::string smart = placement_test::shared_data("smartmoe_expert_loads.json");
  if (smart.empty()) GTEST_SKIP() << "../shared/data not found (set UCPKIT_SOURCE)";
  for (const char* algo : {"lazarus", "eplb", "eplb-global", "spread", "compact", "hecate"}) {
    CliRun r = run("--loads " + smart + " --nodes 8 --gpus-per-node 2 --slots-per-gpu 4 --fault-tolerance 2 --algorithm " +
                algo + " --output " + p("plan.json") + " -q");
    EXPECT_EQ(r.rc, 0) << algo << ": " << r.out;
  }
}

TEST_F(Cli, PreviousPlanReplacementReportsCopiesAndRejectsBadOptions) {
  const std::string cluster = " --nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 ";
  write("drift.json", "[[900,13,40,61,10,165,39,4,73,56,18,86],[20,10,104,640,19,19,187,15,17,86,16,27]]");
  ASSERT_EQ(run("--loads " + p("loads.json") + cluster + "--output " + p("plan.json") + " -q").rc, 0);
  CliRun r = run("--loads " + p("drift.json") + cluster + "--previous " + p("plan.json") +
                 " --expert-bytes 1000 --json --output " + p("next.json"));
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json plan = read("next.json");
  const auto& rep = plan["replacement"];
  EXPECT_EQ(rep["bytes_moved"].get<double>(), 1000.0 * rep["copies_moved"].get<double>());
  EXPECT_EQ(rep["transfers"].size(), rep["copies_moved"].get<size_t>());
  EXPECT_TRUE(rep["from_scratch"].contains("eplb-global"));
  EXPECT_GE(plan["fault_tolerance"], 2);
  nlohmann::json summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["replacement"]["copies_moved"], rep["copies_moved"]);
  struct Case {
    std::string args;
    int rc;
  } cases[] = {
      {"--previous " + p("plan.json") + " --max-moved-bytes 10", 2},  // no --expert-bytes
      {"--previous " + p("plan.json") + " --migration-weight -1", 2},
      {"--previous " + p("plan.json") + " --algorithm eplb", 2},
      {"--previous " + p("plan.json") + " --current " + p("plan.json") + " --failed-nodes 1", 2},
      {"--previous " + p("missing.json"), 1},
  };
  for (const auto& c : cases) {
    CliRun bad = run("--loads " + p("drift.json") + cluster + c.args + " --output " + p("out.json"));
    EXPECT_EQ(bad.rc, c.rc) << c.args << "\n" << bad.out;
    EXPECT_FALSE(fs::exists(dir / "out.json")) << c.args;
    EXPECT_NE(bad.out.find("moe-replace: error:"), std::string::npos) << bad.out;
  }
  CliRun other = run("--loads " + p("drift.json") + " --nodes 2 --gpus-per-node 8 --slots-per-gpu 2 --previous " +
                     p("plan.json") + " --output " + p("out.json"));
  EXPECT_EQ(other.rc, 2) << other.out;
  EXPECT_FALSE(fs::exists(dir / "out.json"));
}

TEST_F(Cli, ReportListsEveryAlgorithmAsItsOwnRunPlacesIt) {
  const std::string cluster = " --nodes 4 --gpus-per-node 4 --slots-per-gpu 2 --fault-tolerance 2 ";
  CliRun r = run("--loads " + p("loads.json") + cluster + "--report --json --output " + p("plan.json"));
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json summary = nlohmann::json::parse(r.out);
  ASSERT_TRUE(summary.contains("pareto"));
  std::set<std::string> names;
  for (const auto& row : summary["pareto"]) {
    std::string name = row["algorithm"];
    names.insert(name);
    ASSERT_TRUE(row.contains("balancedness")) << row.dump();
    EXPECT_EQ(row["recovery_probability"].size(), 3u);  // k = 1..f+1
    CliRun one = run("--loads " + p("loads.json") + cluster + "--algorithm " + name + " -q --output " + p("one.json"));
    ASSERT_EQ(one.rc, 0) << one.out;
    nlohmann::json plan = read("one.json");
    EXPECT_NEAR(row["balancedness"].get<double>(), plan["metrics"]["balancedness"].get<double>(), 1e-12) << name;
    EXPECT_NEAR(row["recovery_probability"]["1"].get<double>(),
                plan["metrics"]["recovery_probability"]["1"].get<double>(), 1e-12) << name;
  }
  for (const char* n : {"balanced-ft", "eplb-global", "lazarus", "spread", "hecate"}) EXPECT_TRUE(names.count(n)) << n;
}

// --current --failed-nodes under the migration model (issue 31 item 3): the plan lists node fetches
// and GPU copies in rounds from surviving nodes only; options that do not apply are exit 2, nothing
// written.
TEST_F(Cli, NodeLossWithMigrationWeightFetchesFromSurvivorsInRounds) {
  CliRun r = replace_after("--failed-nodes 2 --migration-weight 0.5 --expert-bytes 1000 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json next = read("next.json");
  EXPECT_EQ(next["node_ids"], nlohmann::json::parse("[0, 1, 3]"));
  for (const auto& t : next["migration"]["transfers"]) EXPECT_NE(t["from"], 2);
  const auto& rep = next["replacement"];
  EXPECT_EQ(rep["transfers"].size(), rep["copies_moved"].get<size_t>());
  for (const auto& t : rep["transfers"]) {
    EXPECT_NE(t["from_node"], 2);
    EXPECT_NE(t["to_node"], 2);
    EXPECT_LT(t["round"].get<int>(), rep["rounds"].get<int>());
  }
  nlohmann::json summary = nlohmann::json::parse(r.out);
  EXPECT_EQ(summary["replicas_moved"], next["migration"]["replicas_moved"]);
  EXPECT_EQ(summary["bytes_moved"].get<double>(), 1000.0 * summary["replicas_moved"].get<double>());
  const std::string bad[] = {"--added-nodes 1 --migration-weight 1", "--failed-nodes 2 --max-moved-bytes 10",
                             "--failed-nodes 2 --migration-weight 1 --algorithm lazarus",
                             "--failed-nodes 2 --migration-weight -1"};
  for (const auto& args : bad) {
    fs::remove(dir / "next.json");
    CliRun b = replace_after(args);
    EXPECT_EQ(b.rc, 2) << args << "\n" << b.out;
    EXPECT_FALSE(fs::exists(dir / "next.json")) << args;
    EXPECT_NE(b.out.find("moe-replace: error:"), std::string::npos) << b.out;
  }
}

}  // namespace cli_test
