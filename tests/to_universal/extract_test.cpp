// lib/to_universal/extract: plan_checkpoint of the ZeRO-1/2 and native-MoE DeepSpeed fixtures (parameters,
// TP slice shapes and fragments against the generator's ground truth in truth/meta.json), its refusals of
// incomplete or inconsistent checkpoints (each naming the file), and load_work_plan's checks of a plan.json.
#include "to_universal/extract.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace extract_test {
namespace {

using ucpkit::testing::error_of;

using ucpkit::testing::TempDir;

nlohmann::json meta(const std::string& fixture) {
  std::ifstream in(fs::path(kFx) / fixture / "truth" / "meta.json");
  return nlohmann::json::parse(in);
}

// A copy of a fixture's checkpoint (without its truth) to break; returns its global_step100 folder.
fs::path copy_step(const std::string& fixture, const fs::path& dir) {
  fs::copy(fs::path(kFx) / fixture, dir / fixture, fs::copy_options::recursive);
  fs::remove_all(dir / fixture / "truth");
  return dir / fixture / "global_step100";
}

std::string plan_error(const fs::path& checkpoint) {
  return error_of([&] { plan_checkpoint(checkpoint.parent_path().string(), {}); });
}

TEST(ExtractPlan, TpPpDpCheckpointHasTheTruthsParametersAndSliceShapes) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/gpt_tp2_pp2_dp3", {});
  const auto m = meta("gpt_tp2_pp2_dp3");
  EXPECT_EQ(plan.source.tp, 2);
  EXPECT_EQ(plan.source.pp, 2);
  EXPECT_EQ(plan.source.dp, 3);
  EXPECT_EQ(plan.source.zero_stage, 1);
  ASSERT_EQ(plan.params.size(), m["params"].size());
  std::map<std::string, const ParamPlan*> by;
  for (const auto& p : plan.params) by[p.name] = &p;
  for (const auto& t : m["params"]) {
    const std::string name = t["name"];
    SCOPED_TRACE(name);
    ASSERT_TRUE(by.count(name));
    const ParamPlan& p = *by[name];
    std::vector<int64_t> slice = t["shape"];
    if (t["vocab"]) slice[0] = m["padded_vocab"];  // the TP slices hold the padded rows
    if (t["kind"] == "col") slice[0] /= 2;
    if (t["kind"] == "row") slice[1] /= 2;
    ASSERT_EQ(p.tp_shapes.size(), 2u);
    ASSERT_EQ(p.fragments.size(), 2u);
    for (int tp = 0; tp < 2; ++tp) {
      EXPECT_EQ(p.tp_shapes[tp], slice);
      // The fragments of a TP slice cover it exactly, in partition order.
      int64_t numel = 0, part = -1;
      for (const auto& f : p.fragments[tp]) {
        numel += f.numel;
        EXPECT_GT(f.part, part);
        part = f.part;
        EXPECT_GE(f.file, 0);
        EXPECT_LT(f.file, (int)plan.files.size());
      }
      int64_t want = 1;
      for (auto d : slice) want *= d;
      EXPECT_EQ(numel, want);
    }
    EXPECT_EQ(p.states, (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
    EXPECT_EQ(p.expert, -1);
  }
  // 2 TP x 2 PP x 3 DP optimizer shards; the model files copied into the output are the 4 mp_rank_XX files.
  EXPECT_EQ(plan.files.size(), 12u);
  EXPECT_EQ(plan.model_files.size(), 4u);
  EXPECT_EQ(fs::path(plan.optimizer_state_file).filename(), "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_TRUE(plan.unused_patterns.empty());
}

TEST(ExtractPlan, NativeMoeExpertsCarryTheirLayerAndGlobalExpertId) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/dsmoe_dp4_ep2", {});
  const auto m = meta("dsmoe_dp4_ep2");
  EXPECT_EQ(plan.source.ep, 2);
  EXPECT_EQ(plan.source.dp, 4);
  std::map<std::string, const ParamPlan*> by;
  for (const auto& p : plan.params) by[p.name] = &p;
  ASSERT_EQ(by.size(), m["params"].size());
  int experts = 0;
  for (const auto& t : m["params"]) {
    SCOPED_TRACE(t["name"].get<std::string>());
    ASSERT_TRUE(by.count(t["name"]));
    const ParamPlan& p = *by[t["name"]];
    if (t["expert"].is_null()) {
      EXPECT_EQ(p.expert, -1);
      EXPECT_EQ(p.moe_layer, -1);
    } else {
      ++experts;
      EXPECT_EQ(p.expert, t["expert"].get<int>());
      // moe_layer is the transformer layer the expert is in (its name's layers.N), not the MoE layer ordinal.
      std::smatch m;
      const std::string name = t["name"];
      ASSERT_TRUE(std::regex_search(name, m, std::regex(R"(layers\.(\d+)\.)")));
      EXPECT_EQ(p.moe_layer, std::stoi(m[1].str()));
    }
    std::vector<int64_t> shape = t["shape"];
    if (t["vocab"]) shape[0] = m["padded_vocab"];
    EXPECT_EQ(p.tp_shapes, (std::vector<std::vector<int64_t>>{shape}));
  }
  EXPECT_GT(experts, 0);
}

TEST(ExtractPlan, PatternsFileIsUsedWhenTheCheckpointHasNone) {
  const std::string in = kFx + "/gpt_no_uc_info";
  const auto what = error_of([&] { plan_checkpoint(in, {}); });
  EXPECT_NE(what.find("--patterns"), std::string::npos) << what;
  ExtractOptions o;
  o.patterns_file = kFx + "/gpt_no_uc_info.patterns.json";
  const ExtractPlan plan = plan_checkpoint(in, o);
  EXPECT_EQ(plan.patterns_origin, o.patterns_file);
  EXPECT_EQ(plan.params.size(), meta("gpt_no_uc_info")["params"].size());
  o.patterns_file = kFx + "/unused.patterns.json";
  EXPECT_EQ(plan_checkpoint(in, o).unused_patterns, (std::vector<std::string>{"no_such_param"}));
}

TEST(ExtractPlanRefusals, AMissingOptimizerShardIsNamed) {
  TempDir d;
  const fs::path step = copy_step("gpt_tp2_pp2_dp3", d.path());
  fs::remove(step / "bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt");
  const auto what = plan_error(step);
  EXPECT_NE(what.find("bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt: missing shard"), std::string::npos) << what;
}

TEST(ExtractPlanRefusals, AWholeDpRankMissingIsAnInconsistentWorldSize) {
  TempDir d;
  const fs::path step = copy_step("gpt_tp2_pp2_dp3", d.path());
  for (int mp = 0; mp < 4; ++mp)
    fs::remove(step / ("bf16_zero_pp_rank_2_mp_rank_0" + std::to_string(mp) + "_optim_states.pt"));
  const auto what = plan_error(step);
  EXPECT_NE(what.find("inconsistent world sizes: dp_world_size is 3 but 2"), std::string::npos) << what;
}

TEST(ExtractPlanRefusals, AShardOfAnExtraDpRankIsNamed) {
  TempDir d;
  const fs::path step = copy_step("gpt_tp2_pp2_dp3", d.path());
  for (int mp = 0; mp < 4; ++mp) {
    const std::string sfx = "_mp_rank_0" + std::to_string(mp) + "_optim_states.pt";
    fs::copy_file(step / ("bf16_zero_pp_rank_0" + sfx), step / ("bf16_zero_pp_rank_3" + sfx));
  }
  const auto what = plan_error(step);
  EXPECT_NE(what.find("extra shard"), std::string::npos) << what;
  EXPECT_NE(what.find("dp_world_size is 3"), std::string::npos) << what;
}

TEST(ExtractPlanRefusals, AMissingNativeExpertFileIsNamed) {
  TempDir d;
  const fs::path step = copy_step("dsmoe_dp4_ep2", d.path());
  fs::remove(step / "layer_1_expert_2_mp_rank_00_model_states.pt");
  const auto what = plan_error(step);
  EXPECT_NE(what.find("layer_1_expert_2_mp_rank_00_model_states.pt: missing shard (native MoE layer 1 expert 2"),
            std::string::npos)
      << what;
}

TEST(ExtractPlanRefusals, NativeMoeWithTensorParallelismIsRefused) {
  TempDir d;
  const fs::path step = copy_step("dsmoe_dp4_ep2", d.path());
  for (const auto& e : fs::directory_iterator(step)) {
    std::string n = e.path().filename().string();
    if (auto k = n.find("mp_rank_00"); k != std::string::npos)
      fs::copy_file(e.path(), step / n.replace(k, 10, "mp_rank_01"));
  }
  const auto what = plan_error(step);
  EXPECT_NE(what.find("native DeepSpeed MoE with tp=2 pp=1 is not supported"), std::string::npos) << what;
}

TEST(ExtractPlanRefusals, ACheckpointWithoutShardsIsRefused) {
  TempDir d;
  fs::create_directories(d.path() / "ck" / "global_step1");
  std::ofstream(d.path() / "ck" / "latest") << "global_step1";
  EXPECT_NE(plan_error(d.path() / "ck" / "global_step1"), "");
}

// ------------------------------------------------------------------ load_work_plan

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

TEST(WorkPlan, FilesAreResolvedInsideTheWorkFolder) {
  TempDir d;
  ExtractPlan p;
  p.source = formats::universal::UniversalSource::from_json({{"tp", 1}, {"dp", 1}, {"zero_stage", 1}}, "plan.json");
  p.patterns_json = nlohmann::json::object();
  p.patterns_origin = "builtin";
  p.files = {"fragments/w/tp0.part0.pt"};
  p.model_files = {"mp_rank_00_model_states.pt"};
  p.optimizer_state_file = "optimizer_state.pt";
  write(d.path() / "plan.json", p.to_json().dump());
  const ExtractPlan q = load_work_plan(d.path().string());
  ASSERT_EQ(q.files.size(), 1u);
  EXPECT_EQ(fs::path(q.files[0]), d.path() / "fragments/w/tp0.part0.pt");
  EXPECT_EQ(fs::path(q.model_files[0]), d.path() / "mp_rank_00_model_states.pt");
  EXPECT_EQ(fs::path(q.optimizer_state_file), d.path() / "optimizer_state.pt");
  EXPECT_EQ(q.patterns_origin, "builtin");
}

TEST(WorkPlan, APathOutsideTheFolderIsRefused) {
  TempDir d;
  ExtractPlan p;
  p.source = formats::universal::UniversalSource::from_json({{"tp", 1}, {"dp", 1}, {"zero_stage", 1}}, "plan.json");
  p.patterns_json = nlohmann::json::object();
  p.files = {"../elsewhere.pt"};
  p.optimizer_state_file = "optimizer_state.pt";
  write(d.path() / "w" / "plan.json", p.to_json().dump());
  auto what = error_of([&] { load_work_plan((d.path() / "w").string()); });
  EXPECT_NE(what.find("plan.json"), std::string::npos) << what;
  EXPECT_NE(what.find("fragment file"), std::string::npos) << what;
  p.files = {"fragments/a.pt"};
  p.optimizer_state_file = "/etc/passwd";
  write(d.path() / "w" / "plan.json", p.to_json().dump());
  what = error_of([&] { load_work_plan((d.path() / "w").string()); });
  EXPECT_NE(what.find("optimizer state file"), std::string::npos) << what;
}

TEST(WorkPlan, MalformedOrMissingPlansAreNamed) {
  TempDir d;
  auto what = error_of([&] { load_work_plan(d.path().string()); });
  EXPECT_NE(what.find("plan.json"), std::string::npos) << what;
  write(d.path() / "plan.json", "{\"format\": \"ucpkit-extract-plan\", \"version\": 1, \"files\": 3}");
  what = error_of([&] { load_work_plan(d.path().string()); });
  EXPECT_NE(what.find("plan.json"), std::string::npos) << what;
  write(d.path() / "plan.json", "{not json");
  what = error_of([&] { load_work_plan(d.path().string()); });
  EXPECT_NE(what.find("plan.json"), std::string::npos) << what;
}

}  // namespace
}  // namespace extract_test
}  // namespace ucpkit::to_universal
