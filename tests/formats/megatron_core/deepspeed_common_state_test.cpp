// The ._extra_state object keys Megatron-Core's local-spec model asks for on load
// (formats/megatron_core/deepspeed_common_state.h extra_state_keys), without I/O.
#include <gtest/gtest.h>

#include <algorithm>

#include "formats/megatron_core/deepspeed_common_state.h"
#include "formats/megatron_core/model_facts.h"

namespace megatron_core_deepspeed_common_state_test {

using ucpkit::formats::megatron_core::extra_state_keys;

namespace {

std::vector<std::string> moe_names(int layers, int experts) {
  std::vector<std::string> n = {"embedding.word_embeddings.weight"};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    n.push_back(p + "self_attention.linear_qkv.weight");
    n.push_back(p + "self_attention.linear_proj.weight");
    n.push_back(p + "mlp.router.weight");
    for (int e = 0; e < experts; ++e) n.push_back(p + "mlp.experts.experts." + std::to_string(e) + ".linear_fc1.weight");
  }
  return n;
}

bool has(const std::vector<std::string>& keys, const std::string& k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); }

}  // namespace

// An all-MoE model's layers are stacked (moe_layer_freq 1): megatron-core 0.16.1's GPTModel asks for
// shard_<layer>_<layers> and, for experts, shard_<layer>.<expert>_<layers>.<experts> (seen through its
// sharded_state_dict in tests/frameworks/hf_import_test.sh's Mixtral and Qwen3-MoE cases).
TEST(McoreExtraState, AStackedMoeModelHasTheLayerAxisThenTheExpertAxis) {
  const auto keys = extra_state_keys(moe_names(2, 3), true);
  EXPECT_EQ(keys.size(), 2u * 2 + 2u * 3);
  EXPECT_TRUE(has(keys, "decoder.layers.self_attention.linear_qkv._extra_state/shard_1_2"));
  EXPECT_TRUE(has(keys, "decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_0.2_2.3"));
  EXPECT_TRUE(has(keys, "decoder.layers.mlp.experts.experts.linear_fc1._extra_state/shard_1.0_2.3"));
}

// Mixed dense / MoE layers (a list moe_layer_freq: the args say the stack is not homogeneous) keep
// per-layer keys, as the real save tests/formats/megatron_core/data/moe_ep2 has them.
TEST(McoreExtraState, AnUnstackedMoeModelHasPerLayerKeys) {
  const auto keys = extra_state_keys(moe_names(2, 3), false);
  EXPECT_TRUE(has(keys, "decoder.layers.1.self_attention.linear_qkv._extra_state/shard_0_1"));
  EXPECT_TRUE(has(keys, "decoder.layers.0.mlp.experts.experts.linear_fc1._extra_state/shard_2_3"));
}

// A dense model is stacked whatever the flag (its args never list layer kinds).
TEST(McoreExtraState, ADenseModelIsStacked) {
  EXPECT_EQ(extra_state_keys(moe_names(3, 0), false), extra_state_keys(moe_names(3, 0), true));
  EXPECT_TRUE(has(extra_state_keys(moe_names(3, 0), false), "decoder.layers.self_attention.linear_proj._extra_state/shard_2_3"));
}

// A fresh Megatron-DeepSpeed run's args (megatron_deepspeed_args, its own names: num_key_value_heads, rope_theta,
// layernorm_epsilon, normalization 'rmsnorm') read back through the Megatron-DeepSpeed -> Megatron-Core common
// state give the model they were made from: what the Hugging Face export of such a checkpoint writes config.json from.
TEST(McoreDeepSpeedArgs, AFreshRunsArgsGiveBackTheModelFacts) {
  using namespace ucpkit;
  formats::deepspeed::MegatronGpt m;
  m.hidden = 32, m.ffn = 48, m.layers = 3, m.heads = 4, m.kv_heads = 2, m.head_dim = 8, m.max_positions = 64;
  m.vocab = 100, m.norm_eps = 1e-6, m.rope_theta = 500000, m.tied = true, m.dtype = DType::BFloat16;
  auto root = pickle::Value::dict();
  root->set_item("args", formats::megatron_core::megatron_deepspeed_args(m, 128));
  root->set_item("iteration", pickle::Value::integer(0));
  auto opt = pickle::Value::dict();
  opt->set_item("param_groups", pickle::Value::list());
  const auto common = formats::megatron_core::common_state_from_deepspeed(root, "mp_rank_00_model_states.pt", opt, nullptr);
  const auto f = formats::megatron_core::model_facts(common, "mp_rank_00_model_states.pt");
  EXPECT_EQ(f["hidden"], 32);
  EXPECT_EQ(f["ffn"], 48);
  EXPECT_EQ(f["layers"], 3);
  EXPECT_EQ(f["heads"], 4);
  EXPECT_EQ(f["kv_heads"], 2);
  EXPECT_EQ(f["head_dim"], 8);
  EXPECT_EQ(f["max_positions"], 64);
  EXPECT_DOUBLE_EQ(f["norm_eps"].get<double>(), 1e-6);
  EXPECT_DOUBLE_EQ(f["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(f["tied"], true);
  EXPECT_EQ(f["linear_bias"], false);
  EXPECT_EQ(f["experts"], 0);
  EXPECT_EQ(formats::megatron_core::padded_vocab_size(root), 128);
  // With experts in every layer (--num-experts [4], --expert-interval 1, --topk 2): Megatron-Core's MoE facts.
  m.experts = 4, m.topk = 2, m.aux_loss = 0.001;
  root->set_item("args", formats::megatron_core::megatron_deepspeed_args(m, 128));
  const auto moe = formats::megatron_core::model_facts(
      formats::megatron_core::common_state_from_deepspeed(root, "mp_rank_00_model_states.pt", opt, nullptr), "m");
  EXPECT_EQ(moe["experts"], 4);
  EXPECT_EQ(moe["moe_topk"], 2);
  EXPECT_EQ(moe["moe_ffn"], 48);
  EXPECT_DOUBLE_EQ(moe["moe_aux_loss"].get<double>(), 0.001);
  EXPECT_EQ(moe["dense_layers"], nlohmann::json::array());
}

// Megatron-DeepSpeed's --num-experts defaults to [1] (megatron/arguments.py:608 at 4efb479): a dense model, not one
// expert per layer.
TEST(McoreDeepSpeedArgs, NumExpertsOfOneIsADenseModel) {
  using namespace ucpkit;
  formats::deepspeed::MegatronGpt m;
  m.hidden = 32, m.ffn = 48, m.layers = 2, m.heads = 4, m.kv_heads = 2, m.head_dim = 8, m.max_positions = 64, m.vocab = 100;
  auto args = formats::megatron_core::megatron_deepspeed_args(m, 128);
  args->set_attr("num_experts", pickle::Value::list({pickle::Value::integer(1)}));
  auto root = pickle::Value::dict();
  root->set_item("args", args);
  auto opt = pickle::Value::dict();
  opt->set_item("param_groups", pickle::Value::list());
  const auto f = formats::megatron_core::model_facts(
      formats::megatron_core::common_state_from_deepspeed(root, "mp_rank_00_model_states.pt", opt, nullptr), "m");
  EXPECT_EQ(f["experts"], 0);
}

}  // namespace megatron_core_deepspeed_common_state_test
