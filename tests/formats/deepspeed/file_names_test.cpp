// formats/deepspeed/file_names: the name builders spell what DeepSpeed saves (engine.py _get_ckpt_name,
// _get_zero_ckpt_name, _get_expert_ckpt_name, _get_optimizer_ckpt_name; PipelineModule.ckpt_layer_path)
// and parse_file_name() reads each of them back with the same ranks.
#include <gtest/gtest.h>

#include "formats/deepspeed/file_names.h"

namespace deepspeed_file_names_test {

using namespace ucpkit::formats::deepspeed;

TEST(FileNames, SpelledAsDeepSpeedSavesThem) {
  EXPECT_EQ(model_states_name(3), "mp_rank_03_model_states.pt");
  EXPECT_EQ(zero3_model_states_name(12, 1), "zero_pp_rank_12_mp_rank_01_model_states.pt");
  EXPECT_EQ(optim_states_name(5, 0, true), "bf16_zero_pp_rank_5_mp_rank_00_optim_states.pt");
  EXPECT_EQ(optim_states_name(5, 10, false), "zero_pp_rank_5_mp_rank_10_optim_states.pt");
  EXPECT_EQ(layer_states_name(7, 1), "layer_07-model_01-model_states.pt");
  EXPECT_EQ(expert_states_name(2, 15, 0), "layer_2_expert_15_mp_rank_00_model_states.pt");
  EXPECT_EQ(expert_optim_name(3, 0), "expp_rank_3_mp_rank_00_optim_states.pt");
}

TEST(FileNames, ParseFileNameReadsEveryBuiltNameBack) {
  auto f = parse_file_name(model_states_name(3));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::ModelStates);
  EXPECT_EQ(f->mp, 3);
  f = parse_file_name(zero3_model_states_name(12, 1));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::Zero3ModelStates);
  EXPECT_EQ(f->dp, 12);
  EXPECT_EQ(f->mp, 1);
  f = parse_file_name(optim_states_name(5, 2, true));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::OptimStates);
  EXPECT_TRUE(f->bf16);
  EXPECT_EQ(f->dp, 5);
  EXPECT_EQ(f->mp, 2);
  f = parse_file_name(layer_states_name(7, 1));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::LayerStates);
  EXPECT_EQ(f->layer, 7);
  EXPECT_EQ(f->tp, 1);
  f = parse_file_name(expert_states_name(2, 15, 0));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::ExpertStates);
  EXPECT_EQ(f->moe_layer, 2);
  EXPECT_EQ(f->expert, 15);
  f = parse_file_name(expert_optim_name(3, 0));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, FileKind::ExpertOptim);
  EXPECT_EQ(f->ep_rank, 3);
}

}  // namespace deepspeed_file_names_test
