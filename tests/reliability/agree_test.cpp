// Shards that must agree (issue "Reliability" item 2): checkpoints whose files are each valid torch
// files but do not belong together (fixtures_shards.py: a rank's optimizer state dropped or filed
// under another group, exp_avg missing on one rank, param_slice_mappings that overlap or leave a hole,
// a shard or model file of another step, another DeepSpeed version) converted with exit 0 into a
// wrong universal checkpoint. ucp-union and ucp-extract must refuse them: exit 1, one line naming
// the changed file and what disagrees, nothing written.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/paths.h"
#include "support/process.h"

namespace agree_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;
using ucpkit::testing::scratch_dir;

namespace {

nlohmann::json cases() {
  std::ifstream in(kFx + "/agree/cases.json");
  nlohmann::json j;
  in >> j;
  return j;
}

size_t entries(const fs::path& dir) { return std::distance(fs::directory_iterator(dir), fs::directory_iterator()); }

// Runs `tool` (ucp-union or ucp-extract) on the case's checkpoint into an empty scratch folder.
void expect_refused(const std::string& name, const std::string& tool = "ucp-union") {
  const auto c = cases().at(name);
  std::string tag = tool;
  std::replace(tag.begin(), tag.end(), ' ', '_');
  const fs::path d = scratch_dir("agree_" + tag + "_" + name);
  const fs::path out = d / "out";
  std::string log;
  const int rc = run_command(kBin + "/" + tool + " --no-sync --input " + quote(c.at("checkpoint")) + " --output " +
                                 quote(out.string()),
                             &log);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find(c.at("file").get<std::string>()), std::string::npos) << "the changed file is not named: " << log;
  EXPECT_NE(log.find(c.at("expect").get<std::string>()), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "not one line: " << log;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(entries(d), 0u) << "something was left in " << d;  // no staging folder, no latest_universal
  fs::remove_all(d);
}

}  // namespace

TEST(Agree, CleanCheckpointConverts) {
  const fs::path d = scratch_dir("agree_clean");
  std::string log;
  EXPECT_EQ(run_command(kBin + "/ucp-union -q --no-sync --input " + quote(cases().at("clean").at("checkpoint")) +
                            " --output " + quote((d / "out").string()),
                        &log),
            0)
      << log;
  EXPECT_TRUE(fs::exists(d / "out" / "manifest.json"));
  fs::remove_all(d);
}

TEST(Agree, RankWithoutOptimizerState) { expect_refused("state_missing"); }
TEST(Agree, StateKeyedUnderAnotherGroup) { expect_refused("state_other_group"); }
TEST(Agree, ExpAvgMissingOnOneRank) { expect_refused("exp_avg_missing"); }
TEST(Agree, OverlappingFragments) { expect_refused("overlap"); }
TEST(Agree, HoleInFragments) { expect_refused("hole"); }
TEST(Agree, ShardOfAnotherStep) { expect_refused("mixed_step_shard"); }
TEST(Agree, ModelFileOfAnotherStep) { expect_refused("mixed_step_model"); }
TEST(Agree, ShardOfAnotherDeepSpeedVersion) { expect_refused("ds_version"); }
TEST(Agree, RankFilesExchanged) { expect_refused("exchanged_ranks"); }
TEST(Agree, Zero3ShardOfAnotherStep) { expect_refused("zero3_mixed_step_shard"); }
TEST(Agree, Zero3ModelFileOfAnotherStep) { expect_refused("zero3_mixed_step_model"); }
// The map phase plans with the same checks (a work folder of a mixed checkpoint is never written).
TEST(Agree, ExtractRefusesToo) {
  expect_refused("mixed_step_shard", "ucp-extract");
  expect_refused("overlap", "ucp-extract");
}

// Issue 32, cause 3: a file of another run saved at the same step (fixtures_shards.py: the generator
// with seed 5 instead of 3; same layout, configuration, release and step, so every identity field
// agrees and 6116fc0 converted the mix with exit 0). The model file's module weights must be the bf16
// image of the fp32 masters (to_universal/master_image.h); the generator writes them as torch's
// .to(bfloat16) of the masters, which is the truth the clean case holds to.
namespace {

// ucp-extract, then ucp-union of the work folder: the union refuses, naming the model file and the
// work folder's fragment (the shard's DP rank is in its name, tp0.partN).
// `file`: the model (or layer) file the message names.
void expect_refused_in_two_steps(const std::string& name,
                                 const std::string& file = "model_states/mp_rank_00_model_states.pt") {
  const auto c = cases().at(name);
  const fs::path d = scratch_dir("agree_2step_" + name);
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-extract -q --no-sync --input " + quote(c.at("checkpoint")) + " --output " +
                            quote((d / "work").string()),
                        &log),
            0)
      << log;
  EXPECT_EQ(run_command(kBin + "/ucp-union --no-sync --input " + quote((d / "work").string()) + " --output " +
                            quote((d / "out").string()),
                        &log),
            1)
      << log;
  EXPECT_NE(log.find(file + ": module weight"), std::string::npos) << log;
  EXPECT_NE(log.find(c.at("expect").get<std::string>()), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "not one line: " << log;
  EXPECT_FALSE(fs::exists(d / "out"));
  fs::remove_all(d);
}

}  // namespace

TEST(Agree, ShardOfAnotherRunAtTheSameStep) {
  expect_refused("other_run_shard");
  expect_refused_in_two_steps("other_run_shard");
  // --no-verify is the way out (module weights edited on purpose after the save).
  const fs::path d = scratch_dir("agree_other_run_no_verify");
  std::string log;
  EXPECT_EQ(run_command(kBin + "/ucp-union -q --no-sync --no-verify --input " +
                            quote(cases().at("other_run_shard").at("checkpoint")) + " --output " + quote((d / "out").string()),
                        &log),
            0)
      << log;
  fs::remove_all(d);
}
TEST(Agree, ModelFileOfAnotherRunAtTheSameStep) {
  expect_refused("other_run_model");
  expect_refused_in_two_steps("other_run_model");
}
// Control: the unmixed checkpoint converts, in one step and in two, to the same bytes.
TEST(Agree, UnmixedRunConverts) {
  const auto c = cases().at("other_run_clean");
  const fs::path d = scratch_dir("agree_other_run_clean");
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --no-sync --input " + quote(c.at("checkpoint")) + " --output " +
                            quote((d / "one").string()),
                        &log),
            0)
      << log;
  ASSERT_EQ(run_command(kBin + "/ucp-extract -q --no-sync --input " + quote(c.at("checkpoint")) + " --output " +
                            quote((d / "work").string()) + " && " + kBin + "/ucp-union -q --no-sync --input " +
                            quote((d / "work").string()) + " --output " + quote((d / "two").string()),
                        &log),
            0)
      << log;
  EXPECT_EQ(run_command("diff -r " + quote((d / "one" / "zero").string()) + " " + quote((d / "two" / "zero").string()), &log), 0)
      << log;
  fs::remove_all(d);
}

// Issue 45, BAD 3: the same mix for a PipelineModule checkpoint, whose module weights are in the layer
// files (layer_XX-model_TT-model_states.pt) that the image check did not index, and ucp-load's direct
// mode, which did not run the check at all (42 of 211 values wrong, exit 0). Both now refuse it.
TEST(Agree, PipelineLayerFileOfAnotherRunAtTheSameStep) {
  expect_refused("pipe_other_run_layer");
  expect_refused("pipe_other_run_shard");
  // In two steps the union reads the layer files from the source folder the work folder records.
  expect_refused_in_two_steps("pipe_other_run_layer", cases().at("pipe_other_run_layer").at("file").get<std::string>());
}
TEST(Agree, DirectLoadRefusesAFileOfAnotherRun) {
  for (const char* name : {"other_run_shard", "other_run_model", "pipe_other_run_layer", "pipe_other_run_shard"})
    expect_refused(name, "ucp-load --dp 2");
}
TEST(Agree, UnmixedPipelineRunConvertsInEveryMode) {
  const auto c = cases().at("pipe_other_run_clean");
  const fs::path d = scratch_dir("agree_pipe_clean");
  std::string log;
  EXPECT_EQ(run_command(kBin + "/ucp-union -q --no-sync --input " + quote(c.at("checkpoint")) + " --output " +
                            quote((d / "one").string()),
                        &log),
            0)
      << log;
  EXPECT_EQ(run_command(kBin + "/ucp-load -q --no-sync --dp 2 --input " + quote(c.at("checkpoint")) + " --output " +
                            quote((d / "direct").string()),
                        &log),
            0)
      << log;
  fs::remove_all(d);
}

// A layer file is opened for the image comparison alone, without a CRC pass (the union reads the
// optimizer shards): a damaged weight in it must still be reported as damage, not as another run.
TEST(Agree, DamagedLayerFileIsReportedAsDamagedNotAsAnotherRun) {
  const auto c = cases().at("pipe_other_run_clean");
  const fs::path d = scratch_dir("agree_damaged_layer");
  const fs::path ckpt = d / "ckpt";
  fs::copy(c.at("checkpoint").get<std::string>(), ckpt, fs::copy_options::recursive);
  const std::string layer = cases().at("pipe_other_run_layer").at("file").get<std::string>();
  std::string log;
  fs::path target;
  for (const auto& e : fs::recursive_directory_iterator(ckpt))
    if (e.path().filename() == layer) target = e.path();
  ASSERT_FALSE(target.empty()) << layer << " not in " << ckpt;
  // Damage case (hand-made bytes): one byte in the middle of the file's largest data record, a weight.
  ASSERT_EQ(run_command(UCPKIT_PYTHON " -c " +
                            quote("import sys, zipfile\n"
                                  "p = sys.argv[1]\n"
                                  "z = zipfile.ZipFile(p)\n"
                                  "i = max((r for r in z.infolist() if '/data/' in r.filename), key=lambda r: r.file_size)\n"
                                  "f = open(p, 'r+b'); f.seek(i.header_offset + 26)\n"
                                  "n, m = int.from_bytes(f.read(2), 'little'), int.from_bytes(f.read(2), 'little')\n"
                                  "at = i.header_offset + 30 + n + m + i.file_size // 2\n"
                                  "f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x40]))\n") +
                            " " + quote(target.string()),
                        &log),
            0)
      << log;
  for (const char* tool : {"ucp-union", "ucp-load --dp 2"}) {
    const fs::path out = d / "out";
    EXPECT_EQ(run_command(kBin + "/" + tool + " --no-sync --input " + quote(ckpt.string()) + " --output " +
                              quote(out.string()),
                          &log),
              1)
        << tool << ": " << log;
    EXPECT_NE(log.find("CRC-32 mismatch"), std::string::npos) << tool << ": " << log;
    EXPECT_NE(log.find(layer), std::string::npos) << tool << ": the damaged file is not named: " << log;
    EXPECT_EQ(log.find("different runs"), std::string::npos) << tool << ": " << log;
    EXPECT_FALSE(fs::exists(out));
  }
  fs::remove_all(d);
}

}  // namespace agree_test
