// lib/to_universal/extract_zero3: plan_zero3 of the ZeRO-3 fixtures (DP 40 with sub-groups, TP 2 x DP 3)
// against the generator's ground truth: every parameter split on its own into ceil(numel / dp) slices, one
// per DP rank in rank order; TP slice shapes; and the refusals of a broken ZeRO-3 checkpoint, each naming
// the file.
#include "to_universal/extract_zero3.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace extract_zero3_test {
namespace {

using ucpkit::testing::error_of;

using ucpkit::testing::TempDir;

nlohmann::json meta(const std::string& fixture) {
  std::ifstream in(fs::path(kFx) / fixture / "truth" / "meta.json");
  return nlohmann::json::parse(in);
}

ExtractPlan plan_of(const std::string& checkpoint) { return plan_zero3(formats::deepspeed::discover(checkpoint), {}); }

fs::path copy_step(const std::string& fixture, const fs::path& dir) {
  fs::copy(fs::path(kFx) / fixture, dir / fixture, fs::copy_options::recursive);
  fs::remove_all(dir / fixture / "truth");
  return dir / fixture / "global_step100";
}

std::string plan_error(const fs::path& step) {
  return error_of([&] { plan_of(step.parent_path().string()); });
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Each DP rank d holds elements [d * c, (d + 1) * c) of the parameter, c = ceil(numel / dp), the last
// rank's slice cut at the end (the rest is padding).
void expect_dp_slices(const ParamPlan& p, int tp, int dp) {
  const int64_t n = numel(p.tp_shapes[tp]), c = (n + dp - 1) / dp;
  int64_t at = 0;
  for (const auto& f : p.fragments[tp]) {
    EXPECT_EQ(f.numel, std::min(c, n - at)) << "part " << f.part;
    EXPECT_EQ(at, int64_t{f.part} * c);
    EXPECT_GE(f.group, 0);
    at += f.numel;
  }
  EXPECT_EQ(at, n);
}

TEST(Zero3Plan, Dp40SubGroupsSplitEveryParameterOverTheRanks) {
  const std::string fx = "gpt_zero3_dp40_subgroups";
  const ExtractPlan plan = plan_of(kFx + "/" + fx);
  const auto m = meta(fx);
  EXPECT_EQ(plan.source.zero_stage, 3);
  EXPECT_EQ(plan.source.dp, 40);
  EXPECT_EQ(plan.source.tp, 1);
  EXPECT_EQ(plan.source.pp, 1);
  EXPECT_EQ(plan.source.ep, 1);
  EXPECT_TRUE(plan.source.flat());
  // DeepSpeed's sub-groups (stage3.py _create_fp16_sub_groups) cut each param group once its ranks' slices
  // (ceil(numel / 40) each) reach sub_group_size = 2000: the decay group's 925 and the no-decay group's 46
  // elements per rank stay one sub-group each.
  EXPECT_EQ(plan.source.sub_groups, 2);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& t : m["params"]) shapes[t["name"]] = t["shape"].get<std::vector<int64_t>>();
  ASSERT_EQ(plan.params.size(), shapes.size());
  for (const ParamPlan& p : plan.params) {
    SCOPED_TRACE(p.name);
    ASSERT_TRUE(shapes.count(p.name));
    EXPECT_EQ(p.tp_shapes, (std::vector<std::vector<int64_t>>{shapes[p.name]}));
    expect_dp_slices(p, 0, 40);
    EXPECT_EQ(p.states.front(), "fp32");
  }
  EXPECT_EQ(plan.files.size(), 40u);
  EXPECT_EQ(plan.model_files.size(), 40u);
  EXPECT_EQ(fs::path(plan.optimizer_state_file).filename(), "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
}

TEST(Zero3Plan, TensorParallelSlicesHaveEachTpRanksShapes) {
  const std::string fx = "gpt_zero3_tp2_dp3_subgroups";
  const ExtractPlan plan = plan_of(kFx + "/" + fx);
  const auto m = meta(fx);
  EXPECT_EQ(plan.source.tp, 2);
  EXPECT_EQ(plan.source.dp, 3);
  EXPECT_FALSE(plan.source.flat());  // joined by the patterns into the ZeRO-1/2 dict form
  EXPECT_TRUE(plan.unused_patterns.empty());
  std::map<std::string, const ParamPlan*> by;
  for (const auto& p : plan.params) by[p.name] = &p;
  ASSERT_EQ(by.size(), m["params"].size());
  for (const auto& t : m["params"]) {
    SCOPED_TRACE(t["name"].get<std::string>());
    ASSERT_TRUE(by.count(t["name"]));
    const ParamPlan& p = *by[t["name"]];
    std::vector<int64_t> slice = t["shape"];
    if (t["vocab"]) slice[0] = m["padded_vocab"];
    if (t["kind"] == "col") slice[0] /= 2;
    if (t["kind"] == "row") slice[1] /= 2;
    ASSERT_EQ(p.tp_shapes.size(), 2u);
    for (int tp = 0; tp < 2; ++tp) {
      EXPECT_EQ(p.tp_shapes[tp], slice);
      expect_dp_slices(p, tp, 3);
    }
  }
  EXPECT_EQ(plan.files.size(), 6u);
  EXPECT_EQ(plan.model_files.size(), 6u);
}

TEST(Zero3PlanRefusals, AMissingShardIsNamed) {
  TempDir d;
  const fs::path step = copy_step("gpt_zero3_tp2_dp3_subgroups", d.path());
  fs::remove(step / "bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt");
  const auto what = plan_error(step);
  EXPECT_NE(what.find("bf16_zero_pp_rank_2_mp_rank_01_optim_states.pt: missing shard"), std::string::npos) << what;
}

TEST(Zero3PlanRefusals, PipelineLayerFilesAreRefused) {
  TempDir d;
  const fs::path step = copy_step("gpt_zero3_tp2_dp3_subgroups", d.path());
  fs::copy_file(step / "zero_pp_rank_0_mp_rank_00_model_states.pt", step / "layer_01-model_00-model_states.pt");
  const auto what = plan_error(step);
  EXPECT_NE(what.find("ZeRO-3 with pipeline parallelism is not supported"), std::string::npos) << what;
}

TEST(Zero3PlanRefusals, AShardOfAnotherDpWorldSizeIsNamed) {
  TempDir d;
  const fs::path step = copy_step("gpt_zero3_tp2_dp3_subgroups", d.path());
  // Rank 1's shard replaced by one of a 40-rank save of another model.
  fs::copy_file(
      fs::path(kFx) / "gpt_zero3_dp40_subgroups/global_step100/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
      step / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", fs::copy_options::overwrite_existing);
  const auto what = plan_error(step);
  EXPECT_NE(what.find("bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"), std::string::npos) << what;
  EXPECT_NE(what.find("inconsistent world sizes: partition_count is 40 but 3 shards were found"), std::string::npos)
      << what;
}

TEST(Zero3PlanRefusals, AZeroOneShardBesideZero3ModelFilesIsNamed) {
  TempDir d;
  const fs::path step = copy_step("gpt_zero3_tp2_dp3_subgroups", d.path());
  fs::copy_file(fs::path(kFx) / "gpt_tp2_pp2_dp3/global_step100/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                step / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", fs::copy_options::overwrite_existing);
  const auto what = plan_error(step);
  EXPECT_NE(what.find("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"), std::string::npos) << what;
  EXPECT_NE(what.find("not ZeRO-3"), std::string::npos) << what;
}

TEST(Zero3PlanRefusals, AModelFileOfAnotherSaveIsNamed) {
  TempDir d;
  const fs::path step = copy_step("gpt_zero3_tp2_dp3_subgroups", d.path());
  // TP rank 1's model file from the other (fp16, GQA) ZeRO-3 fixture: other param_shapes.
  fs::copy_file(
      fs::path(kFx) / "llama_gqa_zero3_tp2_dp2_fp16/global_step100/zero_pp_rank_0_mp_rank_01_model_states.pt",
      step / "zero_pp_rank_0_mp_rank_01_model_states.pt", fs::copy_options::overwrite_existing);
  const auto what = plan_error(step);
  EXPECT_NE(what.find("mp_rank_01"), std::string::npos) << what;
}

}  // namespace
}  // namespace extract_zero3_test
}  // namespace ucpkit::to_universal
