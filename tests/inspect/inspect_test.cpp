// ucp-info and ucp-diff run as users run them: from another working directory, with relative paths,
// on generated checkpoints (tests/inspect/fixtures.py) whose facts the generator itself wrote
// (expect.json, changed.json, damaged.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/universal/manifest.h"
#include "io/torch/torch_file.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace inspect_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::testing::file_bytes;
using ucpkit::testing::quote;
using ucpkit::testing::run_command_status;
using ucpkit::testing::run_logged;

namespace {

std::string scratch(const std::string& name) { return ucpkit::testing::scratch_dir("inspect-" + name); }

// `path` relative to `from` (the working directory the tool runs in).
std::string rel(const std::string& path, const std::string& from) { return fs::relative(path, from).string(); }

using ToolRun = ucpkit::testing::SplitResult;

// Runs `tool args` in `cwd`; stdout and stderr kept apart (in files outside `cwd`: it may be a fixture).
ToolRun run_in(const std::string& cwd, const std::string& tool, const std::string& args, const std::string& env = "") {
  static const std::string io = scratch("io");
  return ucpkit::testing::run_split_in(cwd, env + " " + kBin + "/" + tool + " " + args, io);
}

json parse(const ToolRun& r) {
  try {
    return json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON: " << r.out << "\nstderr: " << r.err;
    return json::object();
  }
}

json expect_of(const std::string& name) { return json::parse(file_bytes(kFx + "/" + name + "/expect.json")); }

uint64_t bytes_under(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

// The facts ucp-info reports against the generator's own.
void expect_facts(json j, json x) {
  EXPECT_EQ(j["tag"], x["tag"]);
  EXPECT_EQ(j["step"], x["step"]);
  for (const char* k : {"tp", "pp", "dp", "ep", "zero_stage", "pipeline"}) EXPECT_EQ(j["layout"][k], x[k]) << k;
  EXPECT_EQ(j["layout"]["optimizer"], "zero");
  EXPECT_EQ(j["tensors"], x["tensors"]);
  EXPECT_EQ(j["parameters"], x["parameters"]);
  EXPECT_EQ(j["experts"]["parameters"], x["expert_parameters"]);
  EXPECT_EQ(j["experts"]["per_layer"], x["experts_per_layer"]);
  EXPECT_EQ(j["experts"]["moe_layers"], x["experts_per_layer"].size());
  EXPECT_EQ(j["dtypes"]["model"], x["model_dtype"]);
  EXPECT_EQ(j["dtypes"]["optimizer"], "float32");
  EXPECT_EQ(j["ds_version"], x["ds_version"]);
  if (!x["ds_line"].is_null()) {
    EXPECT_EQ(j["ds_line"], x["ds_line"]);
  }
  EXPECT_EQ(j["states"], json({"fp32", "exp_avg", "exp_avg_sq"}));
}

void expect_all_checks_ok(json j) {
  ASSERT_TRUE(j["checks"].is_array());
  EXPECT_FALSE(j["checks"].empty());
  for (const auto& c : j["checks"]) EXPECT_EQ(c["status"], "ok") << c.dump();
  EXPECT_EQ(j["ok"], true);
}

int union_into(const std::string& cwd, const std::string& input, const std::string& output) {
  return run_in(cwd, "ucp-union", "--input " + input + " --output " + output + " --no-sync").rc;
}

bool empty_folder(const std::string& dir) { return fs::is_empty(dir); }
}  // namespace

TEST(UcpInfoTool, NativeDenseCheckpointMatchesTheGenerator) {
  const std::string cwd = scratch("dense");
  const std::string ck = kFx + "/gpt_tp2_pp2_dp2";
  // The parent folder with `latest`, relative, no option but --json.
  const ToolRun r = run_in(cwd, "ucp-info", rel(ck, cwd) + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = parse(r);
  EXPECT_EQ(j["kind"], "deepspeed");
  expect_facts(j, expect_of("gpt_tp2_pp2_dp2"));
  expect_all_checks_ok(j);
  EXPECT_EQ(j["size"]["bytes"], bytes_under(ck + "/global_step100"));
  EXPECT_EQ(j["size"]["by_kind"]["optim_states"]["files"], 2 * 2 * 2);  // tp * pp * dp shards
  EXPECT_TRUE(j["experts"]["kind"].is_null());

  // The human summary says the same, on stdout; nothing on stderr.
  const ToolRun t = run_in(cwd, "ucp-info", "--input " + rel(ck, cwd) + "/global_step100/");
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("TP 2, PP 2, DP 2, EP 1, ZeRO stage 1"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("5,408 in 28 tensors"), std::string::npos) << t.out;
  EXPECT_EQ(t.err, "");
}

TEST(UcpInfoTool, NativeMoeCheckpointMatchesTheGenerator) {
  const std::string cwd = scratch("moe");
  const std::string ck = kFx + "/moe_dp4_ep2_fp16/global_step100";  // the tag folder itself
  const ToolRun r = run_in(cwd, "ucp-info", rel(ck, cwd) + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = parse(r);
  expect_facts(j, expect_of("moe_dp4_ep2_fp16"));
  EXPECT_EQ(j["experts"]["kind"], "native");
  expect_all_checks_ok(j);
  EXPECT_EQ(j["size"]["by_kind"]["expert_states"]["files"], 2 * 4);  // 2 MoE layers x 4 experts

  // "." inside the tag folder and a trailing slash name the same tag.
  for (const auto& [where, arg] : {std::pair{ck, std::string(".")}, std::pair{cwd, rel(ck, cwd) + "/"}}) {
    json k = parse(run_in(where, "ucp-info", arg + " --json --no-verify"));
    EXPECT_EQ(k["tag"], "global_step100") << arg;
    EXPECT_EQ(k["step"], 100) << arg;
  }
}

TEST(UcpInfoTool, AutoEpZero3CheckpointMatchesTheGenerator) {
  const std::string cwd = scratch("autoep");
  const ToolRun r = run_in(cwd, "ucp-info", rel(kFx + "/autoep_zero3", cwd) + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = parse(r);
  expect_facts(j, expect_of("autoep_zero3"));  // no num_experts recorded: the fused weights give E
  EXPECT_EQ(j["experts"]["kind"], "autoep");
  expect_all_checks_ok(j);
}

TEST(UcpInfoTool, UniversalCheckpointMatchesTheGeneratorAndItsChecksumsAreChecked) {
  const std::string cwd = scratch("universal");
  ASSERT_EQ(union_into(cwd, rel(kFx + "/moe_dp4_ep2_fp16", cwd), "uni"), 0);
  const ToolRun r = run_in(cwd, "ucp-info", "uni --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = parse(r);
  EXPECT_EQ(j["kind"], "universal");
  expect_facts(j, expect_of("moe_dp4_ep2_fp16"));
  expect_all_checks_ok(j);
  EXPECT_EQ(j["size"]["bytes"], bytes_under(cwd + "/uni"));

  // One bit of one state file flipped: the checksum check fails, naming the file; exit 1.
  const std::string state = cwd + "/uni/zero/language_model.embedding.word_embeddings.weight/exp_avg.pt";
  std::string bytes = file_bytes(state);
  ASSERT_FALSE(bytes.empty());
  bytes[bytes.size() / 2] ^= 0x01;
  std::ofstream(state, std::ios::binary | std::ios::trunc) << bytes;
  const ToolRun bad = run_in(cwd, "ucp-info", "uni");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_EQ(bad.err.rfind("ucp-info: error: ", 0), 0u) << bad.err;
  EXPECT_NE(bad.err.find("word_embeddings.weight/exp_avg.pt"), std::string::npos) << bad.err;
  // --no-verify skips the checksums: the rest still holds.
  EXPECT_EQ(run_in(cwd, "ucp-info", "uni --no-verify -q").rc, 0);
}

TEST(UcpInfoTool, DamagedShardIsReportedWithWhatCouldBeRead) {
  const std::string cwd = scratch("damaged");
  const std::string file = json::parse(file_bytes(kFx + "/moe_damaged/damaged.json"))["file"];
  const ToolRun r = run_in(cwd, "ucp-info", rel(kFx + "/moe_damaged", cwd) + " --json");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  json j = parse(r);
  EXPECT_EQ(j["ok"], false);
  bool plan_failed = false;
  for (const auto& c : j["checks"])
    if (c["name"] == "plan") {
      plan_failed = c["status"] == "failed";
      EXPECT_NE(c["error"].get<std::string>().find(file), std::string::npos) << c.dump();
    }
  EXPECT_TRUE(plan_failed) << j["checks"].dump();
  EXPECT_EQ(j["layout"]["dp"], 4);  // what the file names give is still reported
}

TEST(UcpInfoTool, PecStoreIsDescribedAndAMissingObjectReported) {
  const std::string cwd = scratch("store");
  const std::string ck = rel(kFx + "/moe_dp4_ep2_fp16", cwd);
  ASSERT_EQ(run_in(cwd, "pec-save", "--checkpoint " + ck + " --store store --step 100 --policy sequential --k 1").rc, 0);
  const ToolRun r = run_in(cwd, "ucp-info", "store/ --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = parse(r);
  EXPECT_EQ(j["kind"], "pec-store");
  EXPECT_EQ(j["step"], 100);
  EXPECT_EQ(j["experts"]["per_layer"], expect_of("moe_dp4_ep2_fp16")["experts_per_layer"]);
  ASSERT_EQ(j["store"]["steps"].size(), 1u);
  EXPECT_EQ(j["store"]["steps"][0]["step"], 100);
  EXPECT_EQ(j["store"]["steps"][0]["experts_saved"], 8);  // the first save stores every expert
  EXPECT_EQ(j["store"]["restorable_step"], 100);
  expect_all_checks_ok(j);
  EXPECT_EQ(j["size"]["bytes"], bytes_under(cwd + "/store"));

  // One object removed: the objects check fails naming it; exit 1.
  std::string victim;
  for (const auto& e : fs::recursive_directory_iterator(cwd + "/store/objects"))
    if (e.is_regular_file()) victim = e.path().string();
  ASSERT_FALSE(victim.empty());
  fs::remove(victim);
  const ToolRun bad = run_in(cwd, "ucp-info", "store");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.err.find(fs::path(victim).filename().string()), std::string::npos) << bad.err;
}

TEST(UcpInfoTool, UsageAndFoldersThatAreNoCheckpoint) {
  const std::string cwd = scratch("usage");
  EXPECT_EQ(run_in(cwd, "ucp-info", "").rc, 2);
  EXPECT_EQ(run_in(cwd, "ucp-info", "--no-such-option x").rc, 2);
  fs::create_directories(cwd + "/empty");
  const ToolRun r = run_in(cwd, "ucp-info", "empty");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.err.rfind("ucp-info: error: empty", 0), 0u) << r.err;
  EXPECT_EQ(run_in(cwd, "ucp-info", "missing").rc, 1);
}

TEST(UcpDiffTool, NativeCheckpointEqualsItsRelayout) {
  const std::string cwd = scratch("relayout");
  const std::string ck = rel(kFx + "/gpt_tp2_pp2_dp2", cwd);
  ASSERT_EQ(run_in(cwd, "ucp-load", "--input " + ck + " --output re --tp 1 --pp 2 --dp 3 --zero-stage 1 --no-sync").rc, 0);
  fs::create_directories(cwd + "/tmp");
  const ToolRun r = run_in(cwd, "ucp-diff", ck + " re --tmp-dir tmp --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  json j = parse(r);
  EXPECT_EQ(j["equal"], true);
  EXPECT_EQ(j["a"]["form"], "native");
  EXPECT_EQ(j["b"]["form"], "native");
  // fp32, exp_avg, exp_avg_sq, and the non-tensor items (issue 47): each parameter's step, param_groups
  const int params = expect_of("gpt_tp2_pp2_dp2")["tensors"].get<int>();
  EXPECT_EQ(j["non_tensor_items"], params + 1);
  EXPECT_EQ(j["tensors"], 3 * params + params + 1);
  EXPECT_EQ(j["tensors_equal"], j["tensors"]);
  EXPECT_TRUE(empty_folder(cwd + "/tmp"));  // the conversions are gone

  // A universal checkpoint against a native one: the same values.
  ASSERT_EQ(union_into(cwd, ck, "uni"), 0);
  const ToolRun u = run_in(cwd, "ucp-diff", "uni re/");
  EXPECT_EQ(u.rc, 0) << u.err;
  EXPECT_NE(u.out.find("equal: all"), std::string::npos) << u.out;
}

// A native MoE run saved at EP 2, relaid out at EP 4 and EP 1: the same run. DeepSpeed names an expert
// param group after its EP size ("ep_size_2"), a name of the layout, not a setting: ucp-diff said exit 3
// on every EP change (`param_groups: group 2 name: "ep_size_2" vs "ep_size_4"`).
TEST(UcpDiffTool, MoeCheckpointEqualsItsRelayoutAtAnotherEp) {
  const std::string cwd = scratch("relayout_ep");
  const std::string ck = rel(kFx + "/moe_dp4_ep2_fp16", cwd);
  for (const char* ep : {"4", "1"}) {
    SCOPED_TRACE(ep);
    const std::string out = std::string("ep") + ep;
    ASSERT_EQ(run_in(cwd, "ucp-load", "--input " + ck + " --output " + out + " --ep " + ep + " --dp 4 --no-sync").rc, 0);
    const ToolRun r = run_in(cwd, "ucp-diff", ck + " " + out + " --json");
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    EXPECT_EQ(parse(r)["equal"], true) << r.out;
  }
  // what differs is still found: one exp_avg value moved in a copy of the EP 2 source
  EXPECT_EQ(run_in(cwd, "ucp-diff", rel(kFx + "/moe_changed", cwd) + " ep4 -q").rc, 3);
}

TEST(UcpDiffTool, OneChangedOptimizerValueIsADifference) {
  const std::string cwd = scratch("changed");
  json changed = json::parse(file_bytes(kFx + "/moe_changed/changed.json"));
  fs::create_directories(cwd + "/tmp");
  const std::string a = rel(kFx + "/moe_dp4_ep2_fp16", cwd), b = rel(kFx + "/moe_changed", cwd);
  const ToolRun r = run_in(cwd, "ucp-diff", a + " " + b + " --json", "TMPDIR=tmp");
  ASSERT_EQ(r.rc, 3) << r.err;
  json j = parse(r);
  EXPECT_EQ(j["equal"], false);
  EXPECT_EQ(j["differences"], 1);
  EXPECT_EQ(j["tensors_equal"].get<int>() + 1, j["tensors"].get<int>());
  ASSERT_EQ(j["listed"].size(), 1u);
  EXPECT_EQ(j["listed"][0]["param"], changed["param"]);
  EXPECT_EQ(j["listed"][0]["state"], changed["state"]);
  EXPECT_EQ(j["listed"][0]["kind"], "values");
  EXPECT_EQ(j["listed"][0]["differing"], 1);
  EXPECT_NEAR(j["listed"][0]["max_abs_diff"].get<double>(), 0.25, 1e-6);
  EXPECT_TRUE(empty_folder(cwd + "/tmp"));

  // The summary names it; within --atol it counts as equal, exit 0.
  const ToolRun t = run_in(cwd, "ucp-diff", a + " " + b + " --tmp-dir tmp");
  EXPECT_EQ(t.rc, 3);
  EXPECT_NE(t.out.find(changed["param"].get<std::string>() + " exp_avg: values"), std::string::npos) << t.out;
  EXPECT_EQ(run_in(cwd, "ucp-diff", a + " " + b + " --tmp-dir tmp --atol 0.3 -q").rc, 0);
  EXPECT_EQ(run_in(cwd, "ucp-diff", a + " " + b + " --tmp-dir tmp --rtol 1e-9 -q").rc, 3);
}

// Issue 47: through the universal form the optimizer's step and its param_groups (the learning rate)
// are compared too; a change in either is a difference (exit 3), whatever the tolerance.
TEST(UcpDiffTool, StepAndLearningRateDifferencesAreFound) {
  const std::string cwd = scratch("step_lr");
  ASSERT_EQ(union_into(cwd, rel(kFx + "/gpt_tp2_pp2_dp2", cwd), "uni"), 0);
  fs::copy(cwd + "/uni", cwd + "/step", fs::copy_options::recursive);
  fs::copy(cwd + "/uni", cwd + "/lr", fs::copy_options::recursive);
  const auto manifest = ucpkit::formats::universal::read_universal_manifest(cwd + "/uni/manifest.json");
  const auto& p = manifest.params.front();
  ASSERT_TRUE(p.step);
  // one parameter's step one more (the manifest's crc32s cover state tensors, not step.pt)
  const std::string step_pt = (fs::path(cwd + "/step") / p.states.at("fp32").file).parent_path() / "step.pt";
  const auto step = ucpkit::load_torch(step_pt);
  ASSERT_TRUE(step->is(ucpkit::pickle::Kind::Float) || step->is(ucpkit::pickle::Kind::Int)) << step->repr();
  ucpkit::save_torch_file(step_pt, ucpkit::pickle::Value::real(step->as_float() + 1));
  // the first param group's learning rate doubled
  const std::string opt_pt = cwd + "/lr/" + manifest.optimizer_state;
  const auto opt = ucpkit::load_torch(opt_pt);
  const auto group = opt->at("param_groups")->items.at(0);
  const double lr = group->at("lr")->as_float();
  group->set_item("lr", ucpkit::pickle::Value::real(2 * lr));
  ucpkit::save_torch_file(opt_pt, opt);

  EXPECT_EQ(run_in(cwd, "ucp-diff", "uni uni -q").rc, 0);
  const ToolRun s = run_in(cwd, "ucp-diff", "uni step --json --atol 10");
  ASSERT_EQ(s.rc, 3) << s.err;
  json j = parse(s);
  EXPECT_EQ(j["differences"], 1);
  ASSERT_EQ(j["listed"].size(), 1u);
  EXPECT_EQ(j["listed"][0]["param"], p.name);
  EXPECT_EQ(j["listed"][0]["state"], "step");
  EXPECT_EQ(j["listed"][0]["kind"], "item");
  const ToolRun l = run_in(cwd, "ucp-diff", "uni lr");
  ASSERT_EQ(l.rc, 3) << l.err;
  EXPECT_NE(l.out.find("param_groups: item: group 0 lr: " + json(lr).dump() + " vs " + json(2 * lr).dump()),
            std::string::npos)
      << l.out;
}

TEST(UcpDiffTool, ParametersInOneOnlyAreDifferences) {
  const std::string cwd = scratch("models");
  fs::create_directories(cwd + "/tmp");
  const ToolRun r = run_in(cwd, "ucp-diff",
                       rel(kFx + "/gpt_tp2_pp2_dp2", cwd) + " " + rel(kFx + "/moe_dp4_ep2_fp16", cwd) +
                           " --tmp-dir tmp --json --max-listed 1000");
  ASSERT_EQ(r.rc, 3) << r.err;
  json j = parse(r);
  size_t only_a = 0, only_b = 0;
  for (const auto& d : j["listed"]) only_a += d["kind"] == "only_in_a", only_b += d["kind"] == "only_in_b";
  EXPECT_GT(only_a, 0u);
  EXPECT_GT(only_b, 0u);
  EXPECT_EQ(j["differences"].get<int>(), j["tensors"].get<int>() - j["tensors_equal"].get<int>());
  EXPECT_LT(j["tensors_equal"].get<int>(), j["tensors"].get<int>());
}

TEST(UcpDiffTool, FailuresAreNotDifferences) {
  const std::string cwd = scratch("fail");
  fs::create_directories(cwd + "/tmp");
  const std::string file = json::parse(file_bytes(kFx + "/moe_damaged/damaged.json"))["file"];
  const ToolRun r = run_in(cwd, "ucp-diff",
                       rel(kFx + "/moe_dp4_ep2_fp16", cwd) + " " + rel(kFx + "/moe_damaged", cwd) + " --tmp-dir tmp");
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_TRUE(empty_folder(cwd + "/tmp"));
  EXPECT_EQ(run_in(cwd, "ucp-diff", "only-one").rc, 2);
  EXPECT_EQ(run_in(cwd, "ucp-diff", "a b --rtol -1").rc, 2);
  EXPECT_EQ(run_in(cwd, "ucp-diff", "tmp tmp").rc, 1);  // no checkpoint
}

TEST(UcpDiffTool, SigtermRemovesTheTemporaryFolder) {
  const std::string cwd = scratch("signal");
  fs::create_directories(cwd + "/tmp");
  const std::string a = rel(kFx + "/moe_dp4_ep2_fp16", cwd);
  // The conversion pauses before its commit (test hook); SIGTERM then arrives while the temporary
  // folder holds a half-made universal checkpoint.
  const std::string script = "cd " + quote(cwd) + " && (UCPKIT_TEST_PAUSE_STAGED=1 " + kBin + "/ucp-diff " + a + " " + a +
                             " --tmp-dir tmp 2>err.txt & pid=$!; for i in $(seq 600); do "
                             "[ -n \"$(find tmp -mindepth 2 -maxdepth 2 -name '.a.*')\" ] && break; sleep 0.05; done; "
                             "sleep 0.2; kill -TERM $pid; wait $pid; exit $?)";
  const int rc = run_command_status(script);
  EXPECT_EQ(rc, 128 + 15) << file_bytes(cwd + "/err.txt");
  EXPECT_TRUE(empty_folder(cwd + "/tmp"));
}

}  // namespace inspect_test
