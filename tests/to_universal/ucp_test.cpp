// ucp-extract / ucp-union end to end: bit-exact universal output against the generator's ground
// truth (checked by tests/to_universal/check_universal.py with Python torch), modes that must agree bit for
// bit (one-step, two-step, threads, MPI ranks), and the failure cases of issue 3.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/paths.h"
#include "support/process.h"
#include "to_universal/union_fragments.h"

namespace ucp_test {

namespace fs = std::filesystem;

namespace {

using Result = ucpkit::testing::CommandResult;
Result sh(const std::string& cmd) { return ucpkit::testing::run_capture(cmd); }

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// A fresh folder for one test's outputs.
fs::path scratch() {
  auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name)
    if (c == '/') c = '_';
  fs::path d = fs::path(kFx) / "runs" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

Result uni(const std::string& args) { return sh(kBin + "/ucp-union -q " + args); }

Result check(const fs::path& out, const std::string& fixture) {
  return sh(kPy + " " + kSrc + "/tests/to_universal/check_universal.py " + q(out) + " " + q(fs::path(kFx) / fixture));
}

// Copies a fixture checkpoint (without truth) for tests that break it.
fs::path copy_fixture(const std::string& name, const fs::path& dir) {
  fs::path dst = dir / name;
  fs::copy(fs::path(kFx) / name, dst, fs::copy_options::recursive);
  fs::remove_all(dst / "truth");
  return dst;
}

// Nothing of the output may be left: neither the folder nor a staging folder beside it.
void expect_no_output(const fs::path& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".ucp-tmp-"), std::string::npos) << e.path();
}

fs::path step_dir(const fs::path& ckpt) { return ckpt / "global_step100"; }

class Layouts : public ::testing::TestWithParam<std::string> {};

TEST_P(Layouts, OneStepBitExact) {
  auto d = scratch();
  auto r = uni("--input " + q(fs::path(kFx) / GetParam()) + " --output " + q(d / "universal"));
  ASSERT_EQ(r.rc, 0) << r.out;
  auto c = check(d / "universal", GetParam());
  EXPECT_EQ(c.rc, 0) << c.out;
}

INSTANTIATE_TEST_SUITE_P(Ucp, Layouts,
                         ::testing::Values("gpt_tp2_pp2_dp3", "gpt_untied_swiglu_tp2_dp3_zero2_fp16",
                                           "llama_gqa_tp2_dp2_bf16opt", "mixtral_tp2_dp2_fp32", "dsmoe_dp4_ep2",
                                           "dsmoe_uneven_experts_dp4_ep2",
                                           "gpt_dp16_padding_ranks", "gpt_zero3_dp40_subgroups",
                                           "gpt_zero3_tp2_dp3_subgroups", "llama_gqa_zero3_tp2_dp2_fp16"));

TEST(Ucp, TwoStepBitExact) {
  auto d = scratch();
  for (std::string fx : {"gpt_tp2_pp2_dp3", "dsmoe_dp4_ep2", "gpt_zero3_tp2_dp3_subgroups"}) {
    auto e = sh(kBin + "/ucp-extract -q --input " + q(fs::path(kFx) / fx) + " --output " + q(d / (fx + ".work")));
    ASSERT_EQ(e.rc, 0) << e.out;
    ASSERT_TRUE(fs::exists(d / (fx + ".work") / "plan.json"));
    fs::create_directories(d / fx);
    auto r = uni("--input " + q(d / (fx + ".work")) + " --output " + q(d / fx / "universal"));
    ASSERT_EQ(r.rc, 0) << r.out;
    auto c = check(d / fx / "universal", fx);
    EXPECT_EQ(c.rc, 0) << c.out;
  }
}

TEST(Ucp, SameBytesForAnyThreadCount) {
  auto d = scratch();
  const auto in = q(fs::path(kFx) / "gpt_tp2_pp2_dp3");
  ASSERT_EQ(uni("--threads 1 --input " + in + " --output " + q(d / "t1")).rc, 0);
  ASSERT_EQ(uni("--threads 2 --input " + in + " --output " + q(d / "t2")).rc, 0);
  auto r = sh("diff -r " + q(d / "t1") + " " + q(d / "t2"));
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(Ucp, MpiTwoRanksSameBytes) {
  if (sh("command -v mpirun").rc != 0) GTEST_SKIP() << "no mpirun";
  auto d = scratch();
  const auto in = q(fs::path(kFx) / "llama_gqa_tp2_dp2_bf16opt");
  ASSERT_EQ(uni("--input " + in + " --output " + q(d / "one")).rc, 0);
  auto r = sh("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe " + kBin +
              "/ucp-union -q --json --input " + in + " --output " + q(d / "two"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"mpi_ranks\": 2"), std::string::npos) << r.out;
  auto diff = sh("diff -r " + q(d / "one") + " " + q(d / "two"));
  EXPECT_EQ(diff.rc, 0) << diff.out;
}

// ucp-extract under MPI: shards split across two ranks, the same work folder byte for byte (diff -r)
// and the same universal checkpoint from it.
TEST(Ucp, MpiExtractSameBytes) {
  if (sh("command -v mpirun").rc != 0) GTEST_SKIP() << "no mpirun";
  auto d = scratch();
  for (std::string fx : {"gpt_tp2_pp2_dp3", "dsmoe_dp4_ep2"}) {
    const auto in = q(fs::path(kFx) / fx);
    ASSERT_EQ(sh(kBin + "/ucp-extract -q --input " + in + " --output " + q(d / (fx + ".one"))).rc, 0);
    auto r = sh("mpirun --allow-run-as-root --oversubscribe -np 2 " + kBin + "/ucp-extract -q --json --input " + in +
                " --output " + q(d / (fx + ".two")));
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("\"mpi_ranks\": 2"), std::string::npos) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '{'), 1) << "one summary (rank 0) expected: " << r.out;
    auto diff = sh("diff -r " + q(d / (fx + ".one")) + " " + q(d / (fx + ".two")));
    EXPECT_EQ(diff.rc, 0) << diff.out;
    fs::create_directories(d / fx);
    ASSERT_EQ(uni("--input " + q(d / (fx + ".one")) + " --output " + q(d / fx / "one")).rc, 0);
    ASSERT_EQ(uni("--input " + q(d / (fx + ".two")) + " --output " + q(d / fx / "two")).rc, 0);
    diff = sh("diff -r " + q(d / fx / "one") + " " + q(d / fx / "two"));
    EXPECT_EQ(diff.rc, 0) << diff.out;
    auto c = check(d / fx / "two", fx);
    EXPECT_EQ(c.rc, 0) << c.out;
  }
}

// Runs `cmd` (argv) in the background with UCPKIT_TEST_PAUSE_STAGED=1, waits until `ready` exists
// inside its staging folder `.<name>.ucp-tmp-<pid>`, sends `sig`, and returns the wait status.
int kill_when_staged(const std::vector<std::string>& cmd, const fs::path& out, const std::string& ready, int sig,
                     bool* reached) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("UCPKIT_TEST_PAUSE_STAGED", "1", 1);
    std::vector<char*> argv;
    for (const auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const fs::path staged = out.parent_path() / ("." + out.filename().string() + ".ucp-tmp-" + std::to_string(pid));
  *reached = false;
  int status = 0;
  for (int i = 0; i < 6000 && !*reached; ++i) {  // up to 60 s for the run to reach its pause
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    *reached = fs::exists(staged / ready);
    if (!*reached) usleep(10000);
  }
  kill(pid, sig);
  waitpid(pid, &status, 0);
  return status;
}

// SIGTERM/SIGINT while the staging folder is written: the folder is removed, the process dies by
// the signal, and a rerun succeeds.
TEST(Ucp, KilledRunLeavesNoStaging) {
  auto d = scratch();
  const std::string in = (fs::path(kFx) / "gpt_tp2_pp2_dp3").string();
  bool reached = false;
  int st = kill_when_staged({kBin + "/ucp-union", "-q", "--input", in, "--output", (d / "u").string()}, d / "u",
                            "manifest.json", SIGTERM, &reached);
  EXPECT_TRUE(reached) << "the run never reached its pause";
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << st;
  expect_no_output(d / "u");
  st = kill_when_staged({kBin + "/ucp-extract", "-q", "--input", in, "--output", (d / "w").string()}, d / "w",
                        "plan.json", SIGTERM, &reached);
  EXPECT_TRUE(reached);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << st;
  expect_no_output(d / "w");
  // Killed right away (before or while planning): nothing either.
  pid_t pid = fork();
  if (pid == 0) {
    execl((kBin + "/ucp-union").c_str(), "ucp-union", "-q", "--input", in.c_str(), "--output", (d / "v").c_str(),
          (char*)nullptr);
    _exit(127);
  }
  kill(pid, SIGTERM);
  waitpid(pid, &st, 0);
  expect_no_output(d / "v");
  auto r = uni("--input " + q(in) + " --output " + q(d / "u"));
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(check(d / "u", "gpt_tp2_pp2_dp3").rc, 0);
}

// SIGKILL cannot be caught: the staging folder stays, and the next run removes it (its pid is dead),
// leaving a live process's folder alone.
TEST(Ucp, StaleStagingSweptAtStart) {
  auto d = scratch();
  const std::string in = (fs::path(kFx) / "gpt_tp2_pp2_dp3").string();
  bool reached = false;
  int st = kill_when_staged({kBin + "/ucp-union", "-q", "--input", in, "--output", (d / "u").string()}, d / "u",
                            "manifest.json", SIGKILL, &reached);
  ASSERT_TRUE(reached);
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(d)) left += e.path().filename().string().rfind(".u.ucp-tmp-", 0) == 0;
  ASSERT_EQ(left, 1u) << "SIGKILL should leave the staging folder";
  const fs::path live = d / (".u.ucp-tmp-" + std::to_string(getpid()));  // this test process: alive
  fs::create_directories(live);
  auto r = uni("--input " + q(in) + " --output " + q(d / "u"));
  ASSERT_EQ(r.rc, 0) << r.out;
  left = 0;
  for (const auto& e : fs::directory_iterator(d)) left += e.path().filename().string().rfind(".u.ucp-tmp-", 0) == 0;
  EXPECT_EQ(left, 1u);
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(check(d / "u", "gpt_tp2_pp2_dp3").rc, 0);
}

// --patterns with a work folder: the patterns were fixed by ucp-extract; refused as a usage error.
TEST(Ucp, PatternsWithWorkFolderRefused) {
  auto d = scratch();
  ASSERT_EQ(sh(kBin + "/ucp-extract -q --input " + q(fs::path(kFx) / "gpt_tp2_pp2_dp3") + " --output " +
               q(d / "work")).rc,
            0);
  for (std::string pat : {std::string("/nonexistent/patterns.json"), kSrc + "/patterns/megatron-gpt-tied.json"}) {
    auto r = uni("--input " + q(d / "work") + " --output " + q(d / "u") + " --patterns " + q(pat));
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("work folder"), std::string::npos) << r.out;
    expect_no_output(d / "u");
  }
}

// Native MoE: a missing expert file is named; TP > 1 is refused.
TEST(Ucp, NativeMoeMissingExpertFileAndTensorParallel) {
  auto d = scratch();
  auto ck = copy_fixture("dsmoe_dp4_ep2", d);
  fs::remove(step_dir(ck) / "layer_1_expert_2_mp_rank_00_model_states.pt");
  auto r = uni("--input " + q(ck) + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("layer_1_expert_2_mp_rank_00_model_states.pt: missing shard"), std::string::npos) << r.out;
  expect_no_output(d / "u");
  r = sh(kBin + "/ucp-extract -q --input " + q(ck) + " --output " + q(d / "w"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("layer_1_expert_2_mp_rank_00_model_states.pt"), std::string::npos) << r.out;
  expect_no_output(d / "w");
  // A second model-parallel rank (every mp_rank_00 file copied to mp_rank_01): tp=2.
  fs::create_directories(d / "tp");
  auto tp = copy_fixture("dsmoe_dp4_ep2", d / "tp");
  for (const auto& e : fs::directory_iterator(step_dir(tp))) {
    std::string n = e.path().filename().string();
    if (auto k = n.find("mp_rank_00"); k != std::string::npos)
      fs::copy_file(e.path(), step_dir(tp) / n.replace(k, 10, "mp_rank_01"));
  }
  r = uni("--input " + q(tp) + " --output " + q(d / "v"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("native DeepSpeed MoE with tp=2 pp=1 is not supported"), std::string::npos) << r.out;
  expect_no_output(d / "v");
}

// Averaging as Python's sum(slices) / n: sum() starts from the int 0, so -0.0 copies give +0.0
// (torch: sum([tensor([-0.]), tensor([-0.])]) / 2 is tensor([0.]), signbit False).
TEST(Ucp, AverageOfNegativeZerosIsPositiveZero) {
  using namespace ucpkit;
  auto a = Tensor::from_vector<float>(DType::Float32, {3}, {-0.0f, 1.5f, -0.0f});
  auto b = Tensor::from_vector<float>(DType::Float32, {3}, {-0.0f, -1.5f, 2.0f});
  patterns::ParamRule rule;
  rule.kind = patterns::JoinKind::Average;
  auto r = to_universal::union_fragments("x", {a, b}, rule, patterns::PatternSet{});
  std::vector<float> v(3);
  r.copy_to(v.data());
  EXPECT_EQ(v[0], 0.0f);
  EXPECT_FALSE(std::signbit(v[0]));
  EXPECT_FALSE(std::signbit(v[1]));
  EXPECT_EQ(v[2], 1.0f);
}

TEST(Ucp, JsonSummary) {
  auto d = scratch();
  // stdout only: the JSON summary (stderr has the native-MoE latest_universal warning, issue 33).
  auto r = sh("(" + kBin + "/ucp-union -q --json --input " + q(fs::path(kFx) / "dsmoe_dp4_ep2") + " --output " +
              q(d / "u") + " 2> " + q(d / "stderr.txt") + ")");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"params", "bytes_read", "bytes_written", "seconds", "peak_rss_bytes"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_GT(j["params"].get<int>(), 0);
  // Native MoE: one entry per global expert, named by its global id.
  auto m = nlohmann::json::parse(std::ifstream(d / "u" / "manifest.json"));
  int experts = 0;
  for (const auto& p : m["params"])
    if (p.contains("expert")) ++experts;
  EXPECT_EQ(experts, 2 /*moe layers*/ * 4 /*experts*/ * 4 /*params each*/);
  EXPECT_TRUE(fs::exists(d / "u" / "zero" /
                         "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.3.dense_h_to_4h.weight" /
                         "fp32.pt"));
}

TEST(Ucp, PatternFileWhenCheckpointHasNone) {
  auto d = scratch();
  const auto in = q(fs::path(kFx) / "gpt_no_uc_info");
  auto r = uni("--input " + in + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--patterns"), std::string::npos) << r.out;
  r = uni("--input " + in + " --output " + q(d / "u") + " --patterns " +
          q(fs::path(kFx) / "gpt_no_uc_info.patterns.json"));
  ASSERT_EQ(r.rc, 0) << r.out;
  auto c = check(d / "u", "gpt_no_uc_info");
  EXPECT_EQ(c.rc, 0) << c.out;
}

// Every shipped pattern file converts the generator's model of its family (fixtures.py
// PATTERN_CASES) bit for bit when given with --patterns (it then wins over the checkpoint's own
// universal_checkpoint_info; only the vocabulary sizes come from the checkpoint).
TEST(Ucp, ShippedPatternFiles) {
  auto d = scratch();
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(kSrc) / "patterns"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 9u);
  std::string pairs;
  for (const auto& f : files) {
    const std::string name = f.stem().string();
    const fs::path ck = fs::path(kFx) / "patterns" / name;
    ASSERT_TRUE(fs::exists(ck)) << "no fixture for shipped pattern file " << f << " (tests/to_universal/fixtures.py PATTERN_CASES)";
    fs::create_directories(d / name);
    auto r = uni("--input " + q(ck) + " --output " + q(d / name / "u") + " --patterns " + q(f));
    ASSERT_EQ(r.rc, 0) << name << ": " << r.out;
    auto m = nlohmann::json::parse(std::ifstream(d / name / "u" / "manifest.json"));
    EXPECT_EQ(m["patterns"]["origin"], f.string()) << name;
    pairs += " " + q(d / name / "u") + " " + q(ck);
  }
  auto c = sh(kPy + " " + kSrc + "/tests/to_universal/check_universal.py" + pairs);
  EXPECT_EQ(c.rc, 0) << c.out;
}

TEST(Ucp, UnusedPatternIsAnError) {
  auto d = scratch();
  const auto in = q(fs::path(kFx) / "gpt_no_uc_info");
  const auto pat = q(fs::path(kFx) / "unused.patterns.json");
  auto r = uni("--input " + in + " --output " + q(d / "u") + " --patterns " + pat);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("unused pattern 'no_such_param'"), std::string::npos) << r.out;
  expect_no_output(d / "u");
  r = uni("--input " + in + " --output " + q(d / "u") + " --patterns " + pat + " --allow-unused-patterns");
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(Ucp, MissingShardThenRerun) {
  auto d = scratch();
  auto ck = copy_fixture("gpt_tp2_pp2_dp3", d);
  const auto f = step_dir(ck) / "bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt";
  fs::rename(f, d / "aside.pt");
  auto r = uni("--input " + q(ck) + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt: missing shard"), std::string::npos) << r.out;
  expect_no_output(d / "u");
  fs::rename(d / "aside.pt", f);
  r = uni("--input " + q(ck) + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 0) << r.out;
}

// ZeRO-3 with TP: the TP slices are joined by the patterns (dict output with cat_dim, full shapes);
// a TP rank's missing shard is named.
TEST(Ucp, Zero3TensorParallel) {
  auto d = scratch();
  const std::string fx = "gpt_zero3_tp2_dp3_subgroups";
  ASSERT_EQ(uni("--input " + q(fs::path(kFx) / fx) + " --output " + q(d / "u")).rc, 0);
  auto m = nlohmann::json::parse(std::ifstream(d / "u" / "manifest.json"));
  EXPECT_EQ(m["source"]["tp"], 2);
  EXPECT_EQ(m["model_files"].size(), 6u);
  for (const auto& p : m["params"]) {
    EXPECT_FALSE(p.contains("flat")) << p["name"];
    if (p["name"] == "language_model.encoder.layers.0.self_attention.dense.weight") {
      EXPECT_EQ(p["shape"], nlohmann::json({4, 4}));
      EXPECT_EQ(p["cat_dim"], 1);
    }
  }
  auto ck = copy_fixture(fx, d);
  fs::remove(step_dir(ck) / "bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt");
  auto r = uni("--input " + q(ck) + " --output " + q(d / "v"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt: missing shard"), std::string::npos) << r.out;
  expect_no_output(d / "v");
  // A pipeline layer file beside ZeRO-3 shards: ZeRO-3 with PP > 1 is refused by name.
  fs::create_directories(d / "pp");
  auto pp = copy_fixture(fx, d / "pp");
  fs::copy_file(step_dir(pp) / "zero_pp_rank_0_mp_rank_00_model_states.pt", step_dir(pp) / "layer_01-model_00-model_states.pt");
  r = uni("--input " + q(pp) + " --output " + q(d / "w"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("ZeRO-3 with pipeline parallelism is not supported"), std::string::npos) << r.out;
  expect_no_output(d / "w");
}

TEST(Ucp, ExtraShard) {
  auto d = scratch();
  auto ck = copy_fixture("gpt_tp2_pp2_dp3", d);
  for (int mp = 0; mp < 4; ++mp) {
    const std::string sfx = "_mp_rank_0" + std::to_string(mp) + "_optim_states.pt";
    fs::copy_file(step_dir(ck) / ("bf16_zero_pp_rank_0" + sfx), step_dir(ck) / ("bf16_zero_pp_rank_3" + sfx));
  }
  auto r = uni("--input " + q(ck) + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("extra shard"), std::string::npos) << r.out;
  expect_no_output(d / "u");
}

TEST(Ucp, InconsistentWorldSizes) {
  auto d = scratch();
  auto ck = copy_fixture("gpt_tp2_pp2_dp3", d);
  for (int mp = 0; mp < 4; ++mp)
    fs::remove(step_dir(ck) / ("bf16_zero_pp_rank_2_mp_rank_0" + std::to_string(mp) + "_optim_states.pt"));
  auto r = uni("--input " + q(ck) + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("inconsistent world sizes"), std::string::npos) << r.out;
  expect_no_output(d / "u");
}

TEST(Ucp, ShapeMismatchBetweenFragments) {
  auto d = scratch();
  auto r = uni("--input " + q(fs::path(kFx) / "bad_shape") + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("shape mismatch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("self_attention.dense.weight"), std::string::npos) << r.out;
  expect_no_output(d / "u");
}

TEST(Ucp, DriftedReplicasNeedTolerance) {
  auto d = scratch();
  const auto in = q(fs::path(kFx) / "drift");
  auto r = uni("--input " + in + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("TP-replicated copies differ"), std::string::npos) << r.out;
  expect_no_output(d / "u");
  r = uni("--input " + in + " --output " + q(d / "u") + " --tolerance 1e-4");
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(Ucp, CorruptFile) {
  auto d = scratch();
  auto ck = copy_fixture("gpt_tp2_pp2_dp3", d);
  const auto f = step_dir(ck) / "bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt";
  fs::resize_file(f, fs::file_size(f) / 2);
  auto r = uni("--input " + q(ck) + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one-line error expected: " << r.out;
  expect_no_output(d / "u");
}

TEST(Ucp, OutputNotWritable) {
  auto r = uni("--input " + q(fs::path(kFx) / "gpt_tp2_pp2_dp3") + " --output /proc/ucpkit-test-out");
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("/proc/ucpkit-test-out"), std::string::npos) << r.out;
}

TEST(Ucp, OutputExists) {
  auto d = scratch();
  const auto in = q(fs::path(kFx) / "gpt_tp2_pp2_dp3");
  ASSERT_EQ(uni("--input " + in + " --output " + q(d / "u")).rc, 0);
  auto r = uni("--input " + in + " --output " + q(d / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("already exists"), std::string::npos) << r.out;
  r = uni("--input " + in + " --output " + q(d / "u") + " --overwrite");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(check(d / "u", "gpt_tp2_pp2_dp3").rc, 0);
}

TEST(Ucp, UsageErrors) {
  EXPECT_EQ(uni("--output /tmp/x").rc, 2);
  EXPECT_EQ(uni("--input a --output b --threads -3").rc, 2);
}

TEST(Ucp, DiskFull) {
  auto d = scratch();
  const fs::path mnt = d / "small";
  fs::create_directories(mnt);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) GTEST_SKIP() << "cannot mount a small tmpfs here";
  auto r = uni("--input " + q(fs::path(kFx) / "gpt_tp2_pp2_dp3") + " --output " + q(mnt / "u"));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  expect_no_output(mnt / "u");
  umount(mnt.c_str());
}

}  // namespace

}  // namespace ucp_test
