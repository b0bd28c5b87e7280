// inspect/info.h in-process: describe() of the generated native checkpoints (tests/inspect/fixtures.py,
// whose facts the generator wrote to expect.json), the damaged one, the folders it refuses, the describer
// registry, and CheckpointInfo's JSON and text forms of hand-filled facts.
#include "inspect/info.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/detect.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace info_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::inspect::Check;
using ucpkit::inspect::CheckpointInfo;
using ucpkit::inspect::describe;
using ucpkit::inspect::InfoOptions;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;

namespace {

json expect_of(const std::string& name) { return json::parse(file_bytes(kFx + "/" + name + "/expect.json")); }

uint64_t bytes_under(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

const Check* check_named(const CheckpointInfo& info, const std::string& name) {
  for (const auto& c : info.checks)
    if (c.name == name) return &c;
  return nullptr;
}

// The facts describe() read against the generator's own.
void expect_facts(const CheckpointInfo& info, const json& x) {
  EXPECT_EQ(info.tag, x["tag"]);
  ASSERT_TRUE(info.step);
  EXPECT_EQ(*info.step, x["step"]);
  ASSERT_TRUE(info.layout);
  EXPECT_EQ(info.layout->tp, x["tp"]);
  EXPECT_EQ(info.layout->pp, x["pp"]);
  EXPECT_EQ(info.layout->dp, x["dp"]);
  EXPECT_EQ(info.layout->ep, x["ep"]);
  EXPECT_EQ(info.layout->pipeline, x["pipeline"]);
  ASSERT_TRUE(info.layout->zero_stage);
  EXPECT_EQ(*info.layout->zero_stage, x["zero_stage"]);
  ASSERT_TRUE(info.tensors && info.parameters && info.expert_parameters);
  EXPECT_EQ(*info.tensors, x["tensors"]);
  EXPECT_EQ(*info.parameters, x["parameters"]);
  EXPECT_EQ(*info.expert_parameters, x["expert_parameters"]);
  EXPECT_EQ(json(info.experts_per_layer), x["experts_per_layer"]);
  EXPECT_EQ(info.dtypes.at("model"), x["model_dtype"]);
  EXPECT_EQ(info.dtypes.at("optimizer"), "float32");
  EXPECT_EQ(info.ds_version, x["ds_version"]);
  EXPECT_EQ(info.states, (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
}
}  // namespace

TEST(InspectInfo, StatusNames) {
  EXPECT_STREQ(ucpkit::inspect::status_name(Check::Status::ok), "ok");
  EXPECT_STREQ(ucpkit::inspect::status_name(Check::Status::failed), "failed");
  EXPECT_STREQ(ucpkit::inspect::status_name(Check::Status::skipped), "skipped");
}

TEST(InspectInfo, NativeDenseCheckpointGivesTheGeneratorsFactsAndEveryCheckHolds) {
  const std::string ck = kFx + "/gpt_tp2_pp2_dp2";
  const CheckpointInfo info = describe(ck, InfoOptions{});
  EXPECT_EQ(info.kind.format, "deepspeed");
  EXPECT_EQ(info.input, ck);
  EXPECT_EQ(fs::path(info.dir).filename(), "global_step100");
  expect_facts(info, expect_of("gpt_tp2_pp2_dp2"));
  EXPECT_EQ(info.experts_kind, "");
  EXPECT_EQ(info.layout->optimizer, "zero");
  EXPECT_TRUE(info.ok());
  EXPECT_EQ(info.first_failure(), nullptr);
  for (const char* name : {"files", "plan", "patterns", "model_info"}) {
    const Check* c = check_named(info, name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(c->status, Check::Status::ok) << name << ": " << c->error;
  }
  EXPECT_NE(check_named(info, "plan")->what.find("CRC-32"), std::string::npos);  // verify is the default
  // Sizes: every regular file under the step folder, the optimizer shards tp * pp * dp of them.
  EXPECT_EQ(info.bytes, bytes_under(ck + "/global_step100"));
  size_t files = 0;
  for (const auto& [kind, s] : info.by_kind) files += s.files;
  EXPECT_EQ(files, info.files);
  EXPECT_EQ(info.by_kind.at("optim_states").files, 8u);
  EXPECT_TRUE(info.store.is_null());
  EXPECT_TRUE(info.dcp.is_null());
}

TEST(InspectInfo, NativeMoeTagFolderWithATrailingSlashNamesItsTag) {
  const std::string ck = kFx + "/moe_dp4_ep2_fp16/global_step100";
  const CheckpointInfo info = describe(ck + "/", InfoOptions{false});
  EXPECT_EQ(info.input, ck);  // the trailing slash dropped: the readers take the tag from the name
  expect_facts(info, expect_of("moe_dp4_ep2_fp16"));
  EXPECT_EQ(info.experts_kind, "native");
  EXPECT_EQ(info.ds_line, expect_of("moe_dp4_ep2_fp16")["ds_line"]);
  EXPECT_EQ(info.by_kind.at("expert_states").files, 8u);                         // 2 MoE layers x 4 experts
  EXPECT_EQ(check_named(info, "plan")->what.find("CRC-32"), std::string::npos);  // --no-verify
  EXPECT_TRUE(info.ok());
}

TEST(InspectInfo, DotIsTheAbsolutePathOfTheWorkingFolder) {
  const fs::path was = fs::current_path();
  fs::current_path(kFx + "/moe_dp4_ep2_fp16/global_step100");
  CheckpointInfo info;
  const std::string error = error_of([&] { info = describe(".", InfoOptions{false}); });
  fs::current_path(was);
  ASSERT_EQ(error, "");
  EXPECT_EQ(info.tag, "global_step100");
  EXPECT_EQ(fs::path(info.input).filename(), "global_step100");
  EXPECT_TRUE(fs::path(info.input).is_absolute());
}

TEST(InspectInfo, DamagedShardFailsThePlanCheckNamingTheFileAndKeepsWhatWasRead) {
  const std::string file = json::parse(file_bytes(kFx + "/moe_damaged/damaged.json"))["file"];
  const CheckpointInfo info = describe(kFx + "/moe_damaged", InfoOptions{});
  EXPECT_FALSE(info.ok());
  const Check* failed = info.first_failure();
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(failed->name, "plan");
  EXPECT_NE(failed->error.find(file), std::string::npos) << failed->error;
  ASSERT_TRUE(info.layout);  // the file names' facts stay
  EXPECT_EQ(info.layout->dp, 4);
  EXPECT_EQ(info.layout->ep, 2);
  const json j = info.to_json();
  EXPECT_EQ(j["ok"], false);
  EXPECT_NE(info.text().find("check       plan: failed - "), std::string::npos) << info.text();

  // Without the CRC-32 checks the flipped byte goes unseen.
  EXPECT_TRUE(describe(kFx + "/moe_damaged", InfoOptions{false}).ok());
}

TEST(InspectInfo, FoldersThatAreNoCheckpointAreRefusedNamingThem) {
  const std::string dir = ucpkit::testing::scratch_dir("info-empty");
  const std::string e = error_of([&] { describe(dir, InfoOptions{}); });
  EXPECT_NE(e.find(dir), std::string::npos) << e;
  EXPECT_NE(e.find("not a checkpoint"), std::string::npos) << e;
  const std::string m = error_of([&] { describe(dir + "/missing", InfoOptions{}); });
  EXPECT_NE(m.find(dir + "/missing"), std::string::npos) << m;
}

TEST(InspectInfo, AFormatWithoutADescriberIsRefusedAndARegisteredOneIsCalled) {
  // A folder format of this test only, recognised by a marker file.
  ucpkit::formats::register_folder_format({"info-test-format", -1000, "INFO_TEST_MARKER (info-test-format)",
                                           [](const std::string& dir) -> std::optional<std::string> {
                                             if (fs::exists(dir + "/INFO_TEST_MARKER")) return std::string();
                                             return std::nullopt;
                                           },
                                           [](const std::string& name) { return name == "INFO_TEST_MARKER"; }});
  const std::string dir = ucpkit::testing::scratch_dir("info-registry");
  std::ofstream(dir + "/INFO_TEST_MARKER") << "x";
  const std::string e = error_of([&] { describe(dir, InfoOptions{}); });
  EXPECT_NE(e.find("a info-test-format folder, which ucp-info does not describe"), std::string::npos) << e;

  bool verify_seen = true;
  ucpkit::inspect::register_describer("info-test-format", [&](CheckpointInfo& info, const InfoOptions& options) {
    verify_seen = options.verify;
    info.dir = info.input;
    info.checks.push_back({"marker", "the marker file", Check::Status::ok, ""});
  });
  const CheckpointInfo info = describe(dir, InfoOptions{false});
  EXPECT_FALSE(verify_seen);
  EXPECT_EQ(info.kind.format, "info-test-format");
  ASSERT_EQ(info.checks.size(), 1u);
  EXPECT_EQ(info.checks[0].name, "marker");
  EXPECT_TRUE(info.ok());
}

TEST(InspectInfo, JsonOfUnknownFactsIsNullAndChecksCarryTheirStatus) {
  CheckpointInfo info;
  info.input = "ck";
  info.kind.format = "deepspeed";
  info.dir = "ck/global_step5";
  info.checks = {{"files", "names", Check::Status::ok, ""},
                 {"checksums", "crc", Check::Status::skipped, ""},
                 {"plan", "plan", Check::Status::failed, "ck/x.pt: bad"},
                 {"later", "after", Check::Status::failed, "second"}};
  const json j = info.to_json();
  for (const char* k : {"tag", "step", "ds_version", "ds_line", "layout", "tensors", "parameters"})
    EXPECT_TRUE(j[k].is_null()) << k;
  EXPECT_TRUE(j["experts"]["kind"].is_null());
  EXPECT_EQ(j["experts"]["moe_layers"], 0);
  EXPECT_FALSE(j.contains("store"));
  EXPECT_FALSE(j.contains("dcp"));
  EXPECT_FALSE(j.contains("hf"));
  EXPECT_EQ(j["kind"], "deepspeed");
  ASSERT_EQ(j["checks"].size(), 4u);
  EXPECT_EQ(j["checks"][0], json({{"name", "files"}, {"what", "names"}, {"status", "ok"}, {"error", nullptr}}));
  EXPECT_EQ(j["checks"][1]["status"], "skipped");
  EXPECT_EQ(j["checks"][2]["error"], "ck/x.pt: bad");
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(info.first_failure()->name, "plan");  // the first failure, not the last

  info.checks.resize(2);  // a skipped check is no failure
  EXPECT_TRUE(info.ok());
  EXPECT_EQ(info.first_failure(), nullptr);
}

TEST(InspectInfo, TextHasTheLayoutParametersWithCommasAndHumanSizes) {
  CheckpointInfo info;
  info.kind.format = "deepspeed";
  info.dir = "ck/global_step7";
  info.tag = "global_step7";
  info.step = 7;
  info.layout = ucpkit::inspect::ParallelLayout{2, 4, 8, 2, std::nullopt, 3, "bf16_optimizer", true};
  info.ds_version = "0.16.4";
  info.parameters = 1234567;
  info.tensors = 25000;  // counts over 999 with separators, as the parameters
  info.expert_parameters = 1000;
  info.experts_per_layer = {4, 8};
  info.experts_kind = "native";
  info.dtypes = {{"model", "bfloat16"}, {"optimizer", "float32"}};
  info.states = {"fp32", "exp_avg"};
  info.bytes = 3 * 1024 * 1024 / 2;  // 1.5 MiB
  info.files = 3;
  info.by_kind["optim_states"] = {2, 1000};
  info.checks = {{"files", "names", Check::Status::ok, ""}};
  const std::string t = info.text();
  EXPECT_EQ(t.rfind("ck/global_step7\n", 0), 0u) << t;
  for (const char* line : {"  kind        deepspeed (global_step7)\n", "  step        7\n",
                           "  layout      TP 2, PP 4, DP 8, EP 2, ZeRO stage 3, BF16_Optimizer, pipeline layer files\n",
                           "  deepspeed   0.16.4\n", "  parameters  1,234,567 in 25,000 tensors (1,000 in experts)\n",
                           "  experts     2 MoE layers, experts per layer 4, 8 (native)\n",
                           "  dtypes      model bfloat16, optimizer float32\n", "  states      fp32, exp_avg\n",
                           "  size        1.5 MiB in 3 files; optim_states 1000 B (2)\n", "  check       files: ok\n"})
    EXPECT_NE(t.find(line), std::string::npos) << line << "\n" << t;
  const json j = info.to_json();
  EXPECT_EQ(j["layout"], json({{"tp", 2},
                               {"pp", 4},
                               {"dp", 8},
                               {"ep", 2},
                               {"zero_stage", 3},
                               {"optimizer", "bf16_optimizer"},
                               {"pipeline", true}}));
  EXPECT_EQ(j["size"]["by_kind"]["optim_states"], json({{"files", 2}, {"bytes", 1000}}));
  EXPECT_EQ(j["experts"]["per_layer"], json({4, 8}));

  // Megatron-Core's ETP shows in both; an unknown release with a version line says so.
  info.layout->etp = 1;
  info.layout->zero_stage.reset();
  info.layout->optimizer = "zero";
  info.ds_version.clear();
  info.ds_line = "0.19.3";
  const std::string u = info.text();
  EXPECT_NE(u.find("TP 2, PP 4, DP 8, EP 2, ETP 1, ZeRO optimizer, pipeline"), std::string::npos) << u;
  EXPECT_NE(u.find("  deepspeed   release not recorded (version line 0.19.3)\n"), std::string::npos) << u;
  EXPECT_EQ(info.to_json()["layout"]["etp"], 1);
}

}  // namespace info_test
