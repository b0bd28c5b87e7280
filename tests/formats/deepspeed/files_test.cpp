// DeepSpeed checkpoint discovery without I/O: file-name classes, degree inference, numeric order,
// completeness errors, native MoE rank topology and expert renumbering.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/moe.h"

namespace deepspeed_files_test {

using namespace ucpkit;
using namespace ucpkit::formats::deepspeed;

namespace {

std::string two(int v) { return (v < 10 ? "0" : "") + std::to_string(v); }

std::vector<std::string> zero12(int tp, int pp, int dp, bool bf16, bool layers) {
  std::vector<std::string> n;
  for (int mp = 0; mp < tp * pp; ++mp) {
    n.push_back("mp_rank_" + two(mp) + "_model_states.pt");
    for (int d = 0; d < dp; ++d)
      n.push_back(std::string(bf16 ? "bf16_" : "") + "zero_pp_rank_" + std::to_string(d) + "_mp_rank_" + two(mp) +
                  "_optim_states.pt");
  }
  if (layers)
    for (int l : {1, 3, 4, 5, 7})
      for (int t = 0; t < tp; ++t) n.push_back("layer_" + two(l) + "-model_" + two(t) + "-model_states.pt");
  return n;
}

}  // namespace

TEST(FileNames, Classes) {
  auto f = parse_file_name("bf16_zero_pp_rank_12_mp_rank_03_optim_states.pt");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::OptimStates);
  EXPECT_TRUE(f->bf16);
  EXPECT_EQ(f->dp, 12);
  EXPECT_EQ(f->mp, 3);
  f = parse_file_name("layer_05-model_states.pt");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::LayerStates);
  EXPECT_EQ(f->layer, 5);
  EXPECT_EQ(f->tp, -1);
  f = parse_file_name("layer_1_expert_13_mp_rank_00_model_states.pt");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::ExpertStates);
  EXPECT_EQ(f->moe_layer, 1);
  EXPECT_EQ(f->expert, 13);
  f = parse_file_name("zero_pp_rank_3_mp_rank_00_model_states.pt");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::Zero3ModelStates);
  f = parse_file_name("expp_rank_2_mp_rank_00_optim_states.pt");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::ExpertOptim);
  EXPECT_FALSE(parse_file_name("latest"));
  EXPECT_FALSE(parse_file_name("mp_rank_00_model_states.pt.tmp"));
}

TEST(InferLayout, TensorParallelOnly) {
  auto L = infer_layout(zero12(4, 1, 3, true, false), "/c/global_step5");
  EXPECT_EQ(L.tp, 4);
  EXPECT_EQ(L.pp, 1);
  EXPECT_EQ(L.dp, 3);
  EXPECT_TRUE(L.bf16_prefix);
  EXPECT_EQ(L.tag, "global_step5");
  EXPECT_EQ(L.optim_files[3][2], "/c/global_step5/bf16_zero_pp_rank_2_mp_rank_03_optim_states.pt");
}

TEST(InferLayout, PipelineFromLayerFiles) {
  auto L = infer_layout(zero12(2, 4, 2, false, true), "/c/g");
  EXPECT_EQ(L.tp, 2);
  EXPECT_EQ(L.pp, 4);
  EXPECT_EQ(L.dp, 2);
  EXPECT_TRUE(L.pipeline);
  EXPECT_EQ(L.pp_rank(5), 2);
  EXPECT_EQ(L.tp_rank(5), 1);
  EXPECT_EQ(L.layer_files.at(7)[1], "/c/g/layer_07-model_01-model_states.pt");
}

TEST(InferLayout, NumericNotAlphabeticalOrder) {
  auto names = zero12(1, 1, 12, false, false);
  std::sort(names.begin(), names.end());  // "rank_10" sorts before "rank_2" alphabetically
  auto L = infer_layout(names, "/c/g");
  ASSERT_EQ(L.dp, 12);
  for (int d = 0; d < 12; ++d)
    EXPECT_EQ(L.optim_files[0][d], "/c/g/zero_pp_rank_" + std::to_string(d) + "_mp_rank_00_optim_states.pt");
}

TEST(InferLayout, MissingShardIsNamed) {
  auto names = zero12(2, 1, 4, false, false);
  names.erase(std::find(names.begin(), names.end(), "zero_pp_rank_2_mp_rank_01_optim_states.pt"));
  try {
    infer_layout(names, "/c/g");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_pp_rank_2_mp_rank_01_optim_states.pt: missing shard"), std::string::npos)
        << e.what();
  }
}

TEST(InferLayout, MissingModelFileAndMixedPrefixes) {
  auto names = zero12(2, 1, 2, false, false);
  names.erase(std::find(names.begin(), names.end(), "mp_rank_01_model_states.pt"));
  EXPECT_THROW(infer_layout(names, "/c/g"), Error);
  names = zero12(1, 1, 2, false, false);
  names.push_back("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  EXPECT_THROW(infer_layout(names, "/c/g"), Error);
  EXPECT_THROW(infer_layout({"mp_rank_00_model_states.pt"}, "/c/g"), Error);
}

TEST(InferLayout, NativeMoeFiles) {
  auto names = zero12(1, 1, 4, true, false);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e)
      names.push_back("layer_" + std::to_string(l) + "_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt");
  names.push_back("expp_rank_1_mp_rank_00_optim_states.pt");
  names.push_back("expp_rank_0_mp_rank_00_optim_states.pt");
  auto L = infer_layout(names, "/c/g");
  EXPECT_EQ(L.tp, 1);
  EXPECT_EQ(L.dp, 4);
  EXPECT_EQ(L.ep, 2);
  EXPECT_FALSE(L.pipeline);  // expert files are not pipeline layer files
  ASSERT_EQ(L.expert_files.size(), 8u);
  EXPECT_EQ(L.expert_files[5].moe_layer, 1);
  EXPECT_EQ(L.expert_files[5].expert, 1);
}

TEST(MoeTopology, DefaultOrder) {
  // DP 8, EP 4: ep_rank = d % 4, expert-DP rank = d / 4.
  EXPECT_EQ(ep_coords(0, 8, 4, false).ep_rank, 0);
  EXPECT_EQ(ep_coords(5, 8, 4, false).ep_rank, 1);
  EXPECT_EQ(ep_coords(5, 8, 4, false).edp_rank, 1);
  EXPECT_EQ(ep_coords(7, 8, 4, false).ep_rank, 3);
}

TEST(MoeTopology, DataBeforeExpert) {
  // DP 8, EP 4, expert-DP 2: ep_rank = d / 2, expert-DP rank = d % 2.
  EXPECT_EQ(ep_coords(5, 8, 4, true).ep_rank, 2);
  EXPECT_EQ(ep_coords(5, 8, 4, true).edp_rank, 1);
  EXPECT_THROW(ep_coords(0, 6, 4, false), Error);
}

TEST(MoeTopology, ExpertNames) {
  const std::string n = "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.1.dense_h_to_4h.weight";
  EXPECT_EQ(local_expert_index(n), 1);
  EXPECT_EQ(transformer_layer_index(n), 3);
  EXPECT_EQ(with_expert_index(n, 13),
            "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.13.dense_h_to_4h.weight");
  EXPECT_FALSE(local_expert_index("language_model.encoder.layers.3.mlp.dense_h_to_4h.weight"));
  EXPECT_EQ(ep_size_from_group_name("ep_size_4"), 4);
  EXPECT_FALSE(ep_size_from_group_name("dense"));
}

}  // namespace deepspeed_files_test
