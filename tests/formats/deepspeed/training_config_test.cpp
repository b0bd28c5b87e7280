// formats/deepspeed/training_config against what tests/formats/fixtures.py asked dsgen to write (the
// layouts and model sizes of tests/reshard/cases.py): precision and ZeRO stage from the saved ds_config,
// Megatron's sizes from args, BF16_Optimizer state told apart from ZeRO's.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/training_config.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "io/torch/torch_file.h"

namespace deepspeed_training_config_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
using ucpkit::testing::fixtures::files_with;

namespace {

pickle::ValuePtr first_model_root(const std::string& checkpoint) {
  const auto files = files_with(checkpoint, "mp_rank_00_model_states.pt");
  EXPECT_FALSE(files.empty()) << checkpoint;
  return load_torch_file(files.at(0)).root;
}

pickle::ValuePtr first_optimizer_state(const std::string& checkpoint) {
  const auto files = files_with(checkpoint, "optim_states.pt");
  EXPECT_FALSE(files.empty()) << checkpoint;
  const auto root = load_torch_file(files.at(0)).root;
  return root->get("optimizer_state_dict");
}

}  // namespace

TEST(TrainingConfig, PrecisionAndStageFromTheSavedDsConfig) {
  // fixtures.py: gpt_tp2dp2_z2_fp16 = zero=2, dtype fp16; gpt_zero3_tp2dp2_subgroups = zero=3 (bf16,
  // the generator's default); llama_tp2_bf16opt = BF16_Optimizer (bf16; the generator's
  // default zero=1, dsgen/writer.py Layout).
  auto fp16 = ds::training_config(first_model_root("gpt_tp2dp2_z2_fp16"));
  EXPECT_EQ(fp16.dtype, DType::Float16);
  EXPECT_EQ(fp16.zero_stage, 2);
  auto z3 = ds::training_config(first_model_root("gpt_zero3_tp2dp2_subgroups"));
  EXPECT_EQ(z3.dtype, DType::BFloat16);
  EXPECT_EQ(z3.zero_stage, 3);
  auto bf16opt = ds::training_config(first_model_root("llama_tp2_bf16opt"));
  EXPECT_EQ(bf16opt.dtype, DType::BFloat16);
  EXPECT_EQ(bf16opt.zero_stage, 1);
  // No ds_config and no args: nothing is said.
  auto bare = pickle::Value::dict();
  EXPECT_FALSE(ds::training_config(bare).dtype);
  EXPECT_FALSE(ds::training_config(bare).zero_stage);
}

TEST(TrainingConfig, MegatronSizesFromArgs) {
  // tests/reshard/cases.py: GPT hidden 32, heads 4, kv_heads 4, ffn 64; LLAMA kv_heads 2.
  auto gpt = ds::megatron_sizes(first_model_root("gpt_tp2dp2_z2_fp16"));
  EXPECT_EQ(gpt.hidden, 32);
  EXPECT_EQ(gpt.heads, 4);
  EXPECT_EQ(gpt.ffn, 64);
  EXPECT_EQ(ds::megatron_sizes(first_model_root("llama_tp2_bf16opt")).kv_heads, 2);
  EXPECT_EQ(ds::megatron_sizes(pickle::Value::dict()).hidden, 0);
  ASSERT_TRUE(ds::raw_module(first_model_root("gpt_tp2dp2_z2_fp16")));
  EXPECT_FALSE(ds::raw_module(pickle::Value::dict()));
}

TEST(TrainingConfig, Bf16OptimizerStateHasNoZeroStage) {
  EXPECT_TRUE(ds::is_bf16_optimizer_state(first_optimizer_state("llama_tp2_bf16opt")));
  EXPECT_FALSE(ds::is_bf16_optimizer_state(first_optimizer_state("gpt_tp2dp2_z2_fp16")));
  EXPECT_FALSE(ds::is_bf16_optimizer_state(nullptr));
}

}  // namespace deepspeed_training_config_test
