// DeepSpeed AutoEP (DeepSpeed >= 0.19.2) under ZeRO-1/2 and ZeRO-3: the generator writes AutoEP checkpoints as
// DeepSpeed v0.19.5's save code does (tests/generator/dsgen/autoep.py); ucp-union (one step, two steps via
// ucp-extract, two MPI ranks) must write the universal form autoep_universal.py writes, checked bit for
// bit against the generator's ground truth by tests/autoep/check_universal.py with Python torch; ucp-load
// --ep must write AutoEP layouts for another EP size; broken inputs must fail with one clear line naming the
// file, exit 1, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/paths.h"
#include "support/process.h"

namespace autoep_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;

namespace {

fs::path scratch(const std::string& name) {
  fs::path d = fs::path(kFx) / "runs" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void expect_matches_truth(const fs::path& out, const std::string& fixture) {
  std::string log;
  const int rc = run_command(kPy + " " + quote(kSrc + "/tests/autoep/check_universal.py") + " " + quote(out.string()) +
                                 " " + quote(kFx + "/" + fixture) + " --ep 1 --ep 2 --ep 4",
                             &log);
  EXPECT_EQ(rc, 0) << log;
}

class AutoEp : public ::testing::TestWithParam<const char*> {};

TEST_P(AutoEp, UnionWritesDeepSpeedsUniversalForm) {
  const std::string c = GetParam();
  const fs::path out = scratch("union_" + c) / "u";
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/" + c) + " --output " + quote(out.string()), &log), 0)
      << log;
  expect_matches_truth(out, c);
  // The manifest tags the expert weights and records the AutoEP layers of the source.
  std::ifstream in(out / "manifest.json");
  nlohmann::json m;
  in >> m;
  ASSERT_TRUE(m["source"].contains("autoep")) << m["source"].dump();
  EXPECT_EQ(m["source"]["autoep"].size(), 2u);
  int tagged = 0;
  for (const auto& p : m["params"])
    if (p.contains("autoep")) {
      ++tagged;
      EXPECT_EQ(p["autoep"]["num_experts"], 4);
      EXPECT_EQ(p["shape"][0], 4) << p["name"];
    }
  EXPECT_EQ(tagged, 6);
}

INSTANTIATE_TEST_SUITE_P(Layouts, AutoEp,
                         ::testing::Values("dp4_ep2_zero1_bf16", "dp4_ep4_zero1_bf16",
                                           "dp6_ep2_zero2_fp16_data_before_expert", "dp2_ep1_zero2_fp32",
                                           "dp4_ep2_zero3_bf16", "dp6_ep2_zero3_fp16_data_before_expert"),
                         [](const auto& info) { return std::string(info.param); });

// Two steps via ucp-extract, and two MPI ranks, agree with the truth.
void extract_union_and_mpi(const std::string& c, const std::string& name) {
  const fs::path d = scratch(name);
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-extract -q --input " + quote(kFx + "/" + c) + " --output " + quote((d / "w").string()), &log), 0)
      << log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote((d / "w").string()) + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  expect_matches_truth(d / "u", c);
  if (run_command("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  ASSERT_EQ(run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe " + kBin +
                            "/ucp-union -q --input " + quote(kFx + "/" + c) + " --output " + quote((d / "m").string()),
                        &log),
            0)
      << log;
  expect_matches_truth(d / "m", c);
}

TEST(AutoEpModes, ExtractThenUnionAndMpiAgreeWithTruth) {
  extract_union_and_mpi("dp6_ep2_zero2_fp16_data_before_expert", "modes");
}

// AutoEP under ZeRO-3 (partition-native): the universal checkpoint equals the one of a ZeRO-1/2 source
// with the same weights (EP 2 and EP 4 layouts): the same expert state files bit for bit, the same
// dense values (as ds_to_universal writes each stage); two steps via ucp-extract and two MPI ranks agree
// with the truth.
TEST(AutoEpZero3, UniversalEqualsTheZero12OneWithTheSameWeights) {
  const fs::path d = scratch("zero3_same");
  std::string log;
  for (const char* c : {"dp4_ep2_zero3_bf16", "dp4_ep2_zero1_bf16", "dp4_ep4_zero1_bf16"})
    ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/" + c) + " --output " + quote((d / c).string()), &log), 0)
        << log;
  for (const char* other : {"dp4_ep2_zero1_bf16", "dp4_ep4_zero1_bf16"}) {
    log.clear();
    EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/same_universal.py") + " " +
                              quote((d / "dp4_ep2_zero3_bf16").string()) + " " + quote((d / other).string()),
                          &log),
              0)
        << other << ": " << log;
  }
}

TEST(AutoEpZero3, ExtractThenUnionAndMpiAgreeWithTruth) {
  extract_union_and_mpi("dp6_ep2_zero3_fp16_data_before_expert", "zero3_modes");
}

struct Bad {
  const char* fixture;
  const char* file;     // the file the message must name
  const char* message;  // and what it must say
};

class AutoEpBadInput : public ::testing::TestWithParam<Bad> {};

TEST_P(AutoEpBadInput, OneClearLineExitOneNothingWritten) {
  const Bad b = GetParam();
  const fs::path out = scratch(std::string("bad_") + b.fixture) / "u";
  for (const char* tool : {"ucp-union", "ucp-extract"}) {
    std::string log;
    const int rc = run_command(kBin + "/" + tool + " -q --input " + quote(kFx + "/bad_" + b.fixture) + " --output " +
                                   quote(out.string()),
                               &log);
    EXPECT_EQ(rc, 1) << tool << ": " << log;
    EXPECT_NE(log.find(b.file), std::string::npos) << tool << ": " << log;
    EXPECT_NE(log.find(b.message), std::string::npos) << tool << ": " << log;
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << tool << ": " << log;
    EXPECT_FALSE(fs::exists(out)) << tool;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AutoEpBadInput,
    ::testing::Values(
        Bad{"missing_expert_file", "layer_1_expert_3_mp_rank_00_model_states.pt", "missing shard (AutoEP layer"},
        Bad{"layer_missing_prefix", "mp_rank_00_model_states.pt", "entry 0 has no 'expert_key_prefix'"},
        Bad{"layer_count_mismatch", "mp_rank_00_model_states.pt", "num_experts 6 != num_local_experts 2 * ep_size 2"},
        Bad{"layers_not_list", "mp_rank_00_model_states.pt", "expected a non-empty list"},
        Bad{"local_shape_mismatch", "mp_rank_00_model_states.pt", "expected num_local_experts 2 in dim 0"},
        Bad{"zero3_tp2", "zero_pp_rank_0_mp_rank_00_model_states.pt", "DeepSpeed refuses AutoEP with AutoTP under ZeRO-3"},
        Bad{"zero3_format_version", "zero_pp_rank_1_mp_rank_00_model_states.pt", "unsupported checkpoint_format_version 2"},
        Bad{"zero3_wrong_place", "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "records expert-DP rank 0 of 2"},
        Bad{"expert_file_wrong_key", "layer_0_expert_1_mp_rank_00_model_states.pt", "unexpected key model.layers.0.mlp.experts.w1.2"}),
    [](const auto& info) { return std::string(info.param.fixture); });

}  // namespace

namespace {

// ucp-load --ep writes AutoEP layouts for another EP size: the folder it writes from EP 2's universal
// checkpoint equals, file by file and value by value, what the generator (DeepSpeed v0.19.5's save
// code) writes at the target layout (tests/autoep/same_layout.py), and ucp-union of it gives the
// ground truth again, bit for bit; EP 2 -> 4 and 4 -> 2, and from a ZeRO-3 AutoEP source.
struct Trip {
  const char* from;  // fixture
  int ep;            // target EP
  const char* same;  // fixture written by the generator at the target layout
};

class AutoEpLoad : public ::testing::TestWithParam<Trip> {};

TEST_P(AutoEpLoad, WritesDeepSpeedsLayoutAtAnotherEpSizeAndRoundTrips) {
  const Trip c = GetParam();
  const fs::path d = scratch(std::string("load_") + c.from + "_ep" + std::to_string(c.ep));
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/" + c.from) + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  ASSERT_EQ(run_command(kBin + "/ucp-load -q --input " + quote((d / "u").string()) + " --output " + quote((d / "t").string()) +
                            " --tp 1 --pp 1 --dp 4 --zero-stage 1 --dtype bf16 --ep " + std::to_string(c.ep),
                        &log),
            0)
      << log;
  log.clear();
  EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/same_layout.py") + " " + quote((d / "t" / "global_step7").string()) +
                            " " + quote(kFx + "/" + c.same + "/global_step7"),
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote((d / "t").string()) + " --output " + quote((d / "u2").string()), &log), 0)
      << log;
  log.clear();
  // Against the truth of the target-layout fixture (the same weights; a ZeRO-1/2 form).
  EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/check_universal.py") + " " + quote((d / "u2").string()) + " " +
                            quote(kFx + "/" + c.same) + " --input " + quote((d / "t").string()),
                        &log),
            0)
      << log;
}

INSTANTIATE_TEST_SUITE_P(Trips, AutoEpLoad,
                         ::testing::Values(Trip{"dp4_ep2_zero1_bf16", 4, "dp4_ep4_zero1_bf16"},
                                           Trip{"dp4_ep4_zero1_bf16", 2, "dp4_ep2_zero1_bf16"},
                                           // from ZeRO-3 (partition-native) to ZeRO-1 at another EP size
                                           Trip{"dp4_ep2_zero3_bf16", 4, "dp4_ep4_zero1_bf16"}),
                         [](const auto& info) { return std::string(info.param.from) + "_to_ep" + std::to_string(info.param.ep); });

// ucp-load --zero-stage 3 writes AutoEP's partition-native ZeRO-3 layout (docs/formats.md "AutoEP under
// ZeRO-3"): the folder equals, file by file, key by key and bit for bit, what the generator writes at
// the target layout from DeepSpeed v0.19.5's save code (per-rank model files with the rank's
// ds_autoep_layers place, no expert files, ds_zero_partition_groups, expert sub-groups partitioned over
// the expert-DP group with per-parameter padding; tests/autoep/same_layout.py); ucp-union of it gives
// the first universal checkpoint again: every atomic file byte for byte from a ZeRO-3 source
// (same_atomic.py), the same values from a ZeRO-1 one (whose dense files have ZeRO-1/2's form,
// same_universal.py), and the generator's truth (check_universal.py).
struct Z3Trip {
  const char* from;  // fixture
  int dp, ep;        // target
  int sub_group_size;  // 0: DeepSpeed's default
  const char* same;  // fixture written by the generator at the target layout
  const char* dtype = "bf16";
};

class AutoEpLoadZero3 : public ::testing::TestWithParam<Z3Trip> {};

TEST_P(AutoEpLoadZero3, WritesDeepSpeedsZero3LayoutAndRoundTripsBitExact) {
  const Z3Trip c = GetParam();
  const fs::path d = scratch(std::string("load3_") + c.from + "_dp" + std::to_string(c.dp) + "_ep" + std::to_string(c.ep) +
                             "_sg" + std::to_string(c.sub_group_size));
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/" + c.from) + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  const std::string sg = c.sub_group_size ? " --sub-group-size " + std::to_string(c.sub_group_size) : "";
  ASSERT_EQ(run_command(kBin + "/ucp-load -q --input " + quote((d / "u").string()) + " --output " + quote((d / "t").string()) +
                            " --tp 1 --pp 1 --zero-stage 3 --dtype " + c.dtype + " --dp " + std::to_string(c.dp) + " --ep " +
                            std::to_string(c.ep) + sg,
                        &log),
            0)
      << log;
  log.clear();
  EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/same_layout.py") + " " + quote((d / "t" / "global_step7").string()) +
                            " " + quote(kFx + "/" + c.same + "/global_step7"),
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote((d / "t").string()) + " --output " + quote((d / "u2").string()), &log), 0)
      << log;
  log.clear();
  const bool zero3_source = std::string(c.from).find("zero3") != std::string::npos;
  EXPECT_EQ(run_command(kPy + " " +
                            quote(kSrc + (zero3_source ? "/tests/autoep/same_atomic.py" : "/tests/autoep/same_universal.py")) +
                            " " + quote((d / "u2").string()) + " " + quote((d / "u").string()),
                        &log),
            0)
      << log;
  log.clear();
  EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/check_universal.py") + " " + quote((d / "u2").string()) + " " +
                            quote(kFx + "/" + c.same) + " --input " + quote((d / "t").string()) + " --ep 1 --ep 2 --ep 4",
                        &log),
            0)
      << log;
}

INSTANTIATE_TEST_SUITE_P(
    Trips, AutoEpLoadZero3,
    ::testing::Values(Z3Trip{"dp4_ep2_zero1_bf16", 4, 4, 0, "dp4_ep4_zero3_bf16"},       // ZeRO-1 EP 2 -> ZeRO-3 EP 4
                      Z3Trip{"dp4_ep4_zero1_bf16", 4, 2, 0, "dp4_ep2_zero3_bf16"},       // ZeRO-1 EP 4 -> ZeRO-3 EP 2
                      Z3Trip{"dp4_ep2_zero3_bf16", 4, 4, 0, "dp4_ep4_zero3_bf16"},       // ZeRO-3 EP 2 -> 4
                      Z3Trip{"dp4_ep4_zero3_bf16", 4, 2, 0, "dp4_ep2_zero3_bf16"},       // ZeRO-3 EP 4 -> 2
                      Z3Trip{"dp4_ep4_zero3_bf16", 8, 2, 0, "dp8_ep2_zero3_bf16"},       // and DP 4 -> 8
                      Z3Trip{"dp8_ep2_zero3_bf16", 4, 2, 200, "dp4_ep2_zero3_bf16_sub200"},  // DP 8 -> 4, sub-groups
                      // expert-DP ranks first, fp16; DP 6 EP 2 -> DP 3 EP 1: padding in every partition
                      Z3Trip{"dp6_ep2_zero3_fp16_data_before_expert", 3, 1, 0, "dp3_ep1_zero3_fp16_data_before_expert",
                             "fp16"}),
    [](const auto& info) {
      const auto& c = info.param;
      return std::string(c.from) + "_to_dp" + std::to_string(c.dp) + "_ep" + std::to_string(c.ep) +
             (c.sub_group_size ? "_sub" + std::to_string(c.sub_group_size) : "");
    });

// Source case `c` through ucp-union, then ucp-load under `mpirun -np 2` back to the source's own
// layout (DP 6, EP 2, ZeRO `zero`, fp16): the written folder must equal the generated source.
void expect_mpi_load_back_to_source(const std::string& c, int zero, const std::string& name) {
  const fs::path d = scratch(name);
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/" + c) + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  ASSERT_EQ(run_command("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --oversubscribe " + kBin +
                            "/ucp-load -q --input " + quote((d / "u").string()) + " --output " + quote((d / "t").string()) +
                            " --tp 1 --pp 1 --dp 6 --ep 2 --zero-stage " + std::to_string(zero) + " --dtype fp16",
                        &log),
            0)
      << log;
  EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/same_layout.py") + " " + quote((d / "t" / "global_step7").string()) +
                            " " + quote(kFx + "/" + c + "/global_step7"),
                        &log),
            0)
      << log;
}

// The same with two MPI ranks (the exchange path), back to the source's own layout (DP 6, EP 2,
// expert-DP ranks first, padded expert partitions): the written folder equals the generated source.
TEST(AutoEpLoadZero3Mpi, SameLayoutDataBeforeExpertEqualsTheSource) {
  if (run_command("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  expect_mpi_load_back_to_source("dp6_ep2_zero3_fp16_data_before_expert", 3, "load3_mpi_same");
}

// Impossible ZeRO-3 AutoEP layouts: one clear line, exit 1 or 2 (usage), nothing written.
struct BadZ3 {
  const char* name;
  const char* args;
  int rc;
  const char* message;
};

class AutoEpLoadZero3BadInput : public ::testing::TestWithParam<BadZ3> {};

TEST_P(AutoEpLoadZero3BadInput, OneClearLineNothingWritten) {
  const BadZ3 c = GetParam();
  const fs::path d = scratch(std::string("load3_bad_") + c.name);
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/dp4_ep2_zero3_bf16") + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  log.clear();
  const int rc = run_command(kBin + "/ucp-load -q --input " + quote((d / "u").string()) + " --output " + quote((d / "t").string()) +
                                 " --zero-stage 3 --dtype bf16 " + c.args,
                             &log);
  EXPECT_EQ(rc, c.rc) << log;
  EXPECT_NE(log.find(c.message), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_FALSE(fs::exists(d / "t"));
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, AutoEpLoadZero3BadInput,
    ::testing::Values(BadZ3{"ep3", "--tp 1 --pp 1 --dp 3 --ep 3", 1, "--ep 3 does not divide the 4 experts of model.layers.0.mlp.experts.w1"},
                      BadZ3{"dp_not_multiple", "--tp 1 --pp 1 --dp 6 --ep 4", 2, "--ep 4 must divide --dp 6"},
                      BadZ3{"tp2", "--tp 2 --pp 1 --dp 2 --ep 2", 1, "TP = PP = 1 and ZeRO stage 1, 2 or 3 only (asked tp=2"},
                      BadZ3{"pp2", "--tp 1 --pp 2 --dp 2 --ep 2", 2, "pipeline parallelism (--pp 2) needs ZeRO stage 0 or 1"}),
    [](const auto& info) { return std::string(info.param.name); });

// Back to the source's own layout (DP 6, EP 2, expert-DP ranks before EP ranks, ZeRO-2, fp16) with two
// MPI ranks (the exchange path): the written folder equals the generated source value by value.
TEST(AutoEpLoadMpi, SameLayoutDataBeforeExpertEqualsTheSource) {
  if (run_command("command -v mpirun") != 0) GTEST_SKIP() << "no mpirun";
  expect_mpi_load_back_to_source("dp6_ep2_zero2_fp16_data_before_expert", 2, "load_mpi_same");
}

// A target EP size that does not divide the experts: one clear line, exit 1, nothing written.
TEST(AutoEpLoadBadInput, EpNotDividingTheExperts) {
  const fs::path d = scratch("load_bad_ep");
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote(kFx + "/dp4_ep2_zero1_bf16") + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  log.clear();
  const int rc = run_command(kBin + "/ucp-load -q --input " + quote((d / "u").string()) + " --output " + quote((d / "t").string()) +
                                 " --tp 1 --pp 1 --dp 3 --zero-stage 1 --dtype bf16 --ep 3",
                             &log);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("--ep 3 does not divide the 4 experts of model.layers.0.mlp.experts.w1"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << log;
  EXPECT_FALSE(fs::exists(d / "t"));
}

}  // namespace

namespace {

// pec-save / pec-restore on AutoEP (ZeRO-1/2, per-expert files): step 7 saved whole, step 8 with one
// expert per layer (sequential, K = 1); the restore takes every dense byte from step 8 and each expert
// (its per-expert file and its rows of the fused weights' fp32 / exp_avg / exp_avg_sq fragments in the
// optimizer shards) from the step the report names; checked through ucp-union against both steps'
// ground truth (tests/autoep/check_pec_restore.py).
TEST(AutoEpPec, PartialSaveRestoresEachExpertFromItsStep) {
  const fs::path d = scratch("pec");
  std::string log;
  const std::string s7 = kFx + "/dp4_ep2_zero1_bf16", s8 = kFx + "/dp4_ep2_zero1_bf16_step8";
  ASSERT_EQ(run_command(kBin + "/pec-save --checkpoint " + quote(s7 + "/global_step7") + " --store " + quote((d / "store").string()) +
                            " --step 7 --policy sequential --k 1",
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(kBin + "/pec-save --checkpoint " + quote(s8 + "/global_step8") + " --store " + quote((d / "store").string()) +
                            " --step 8 --policy sequential --k 1",
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(kBin + "/pec-restore --store " + quote((d / "store").string()) + " --output " + quote((d / "out").string()) +
                            " --report " + quote((d / "report.json").string()),
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --input " + quote((d / "out").string()) + " --output " + quote((d / "u").string()), &log), 0)
      << log;
  log.clear();
  EXPECT_EQ(run_command(kPy + " " + quote(kSrc + "/tests/autoep/check_pec_restore.py") + " " + quote((d / "u").string()) + " " +
                            quote((d / "out" / "global_step8").string()) + " " + quote((d / "report.json").string()) + " 8 7=" +
                            quote(s7) + " 8=" + quote(s8),
                        &log),
            0)
      << log;
}

}  // namespace

}  // namespace autoep_test
