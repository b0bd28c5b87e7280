// formats/megatron_core/key_model: the key forms Megatron-Core's sharded_state_dict code writes
// (transformer_block.py non_homogeneous_layers, moe/experts.py singleton_local_shards, ChainedOptimizer
// prefixes; docs/formats-megatron-core.md), including those no committed fixture has (per-expert
// singleton keys, a homogeneous stack of MoE layers: layer axis then expert axis).
#include <gtest/gtest.h>

#include "formats/megatron_core/key_model.h"
#include "support/errors.h"

namespace megatron_core_key_model_test {

using namespace ucpkit::formats::megatron_core;
using ucpkit::testing::error_of;

namespace {

std::vector<std::string> names(const ModelKey& k, const std::vector<int64_t>& size) {
  std::vector<std::string> out;
  for (const auto& s : param_slices(k, size, "x/.metadata")) out.push_back(s.name);
  return out;
}

}  // namespace

TEST(McoreKeyModel, StackedLayers) {
  const Key k = classify_key("decoder.layers.self_attention.linear_qkv.weight", false, "f");
  EXPECT_EQ(k.kind, KeyKind::Model);
  EXPECT_TRUE(k.model.layer_axis);
  EXPECT_EQ(names(k.model, {2, 48, 16}), (std::vector<std::string>{"decoder.layers.0.self_attention.linear_qkv.weight",
                                                                    "decoder.layers.1.self_attention.linear_qkv.weight"}));
  const auto s = param_slices(k.model, {2, 48, 16}, "f");
  EXPECT_EQ(s[1].index, (std::vector<int64_t>{1}));
  EXPECT_EQ(s[1].shape, (std::vector<int64_t>{48, 16}));
}

TEST(McoreKeyModel, StackedMoeLayersHaveLayerThenExpertAxis) {
  const Key k = classify_key("decoder.layers.mlp.experts.experts.linear_fc2.weight", false, "f");
  ASSERT_TRUE(k.model.layer_axis && k.model.expert_axis);
  const auto s = param_slices(k.model, {2, 4, 16, 24}, "f");
  ASSERT_EQ(s.size(), 8u);
  EXPECT_EQ(s[5].name, "decoder.layers.1.mlp.experts.experts.1.linear_fc2.weight");
  EXPECT_EQ(s[5].index, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(s[5].shape, (std::vector<int64_t>{16, 24}));
}

TEST(McoreKeyModel, SingletonExpertKeysNameTheSameParameters) {
  // singleton_local_shards: decoder.layers.{L}. and experts.{E}. in the key, no leading axes
  const Key k = classify_key("decoder.layers.3.mlp.experts.experts.5.linear_fc1.weight", false, "f");
  EXPECT_EQ(k.model.layer, 3);
  EXPECT_EQ(k.model.expert, 5);
  EXPECT_EQ(k.model.leading_axes(), 0u);
  EXPECT_EQ(names(k.model, {48, 16}), (std::vector<std::string>{"decoder.layers.3.mlp.experts.experts.5.linear_fc1.weight"}));
  // a shared expert is not an expert axis
  const Key sh = classify_key("decoder.layers.1.mlp.shared_experts.linear_fc1.weight", false, "f");
  EXPECT_FALSE(sh.model.expert_axis);
  EXPECT_FALSE(sh.model.expert.has_value());
}

TEST(McoreKeyModel, OptimizerKeys) {
  const Key s = classify_key("optimizer.state.exp_avg.decoder.layers.mlp.linear_fc1.weight", false, "f");
  EXPECT_EQ(s.kind, KeyKind::OptimizerState);
  EXPECT_EQ(s.state, "exp_avg");
  EXPECT_EQ(s.model.key, "decoder.layers.mlp.linear_fc1.weight");
  const Key b = classify_key(
      "chained_1.optimizer.distributed.dp_group_idx_3.gbuf_idx_0.dtype_(torch.bfloat16, torch.float32).bucket_idx_2.exp_avg_sq",
      false, "f");
  EXPECT_EQ(b.kind, KeyKind::DpBucket);
  EXPECT_EQ(b.chain, 1);
  EXPECT_EQ(b.bucket.dp_group_idx, 3);
  EXPECT_EQ(b.bucket.dtypes, "(torch.bfloat16, torch.float32)");
  EXPECT_EQ(b.bucket.bucket_idx, 2);
  EXPECT_EQ(b.bucket.state, "exp_avg_sq");
  const Key o = classify_key("chained_0.optimizer.distributed.dp_group_idx_0.per_bucket_numel/shard_0_1", true, "f");
  EXPECT_EQ(o.kind, KeyKind::Object);
  EXPECT_EQ(o.chain, 0);
}

TEST(McoreKeyModel, UnknownKeysNameTheFile) {
  for (const auto& [fqn, bytes] : std::vector<std::pair<std::string, bool>>{
           {"vision_model.patch.weight", false},
           {"decoder.layers.0.7.weight", false},
           {"optimizer.state.momentum_buffer.output_layer.weight", false},
           {"optimizer.fp32_from_fp16_params.0", false},
           {"some_object/shard_0_1", true},
           {"decoder.layers.0.mlp.linear_fc1.weight", true}}) {
    const std::string msg = error_of([&] { classify_key(fqn, bytes, "/ck/.metadata"); });
    EXPECT_EQ(msg.rfind("/ck/.metadata: Megatron-Core torch_dist: unknown key", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(McoreKeyModel, AnMoeNormsNameUnderTheOtherLayerSpec) {
  EXPECT_EQ(other_spec_norm_name("decoder.layers.3.mlp.linear_fc1.layer_norm_weight"), "decoder.layers.3.pre_mlp_layernorm.weight");
  EXPECT_EQ(other_spec_norm_name("decoder.layers.3.pre_mlp_layernorm.bias"), "decoder.layers.3.mlp.linear_fc1.layer_norm_bias");
  EXPECT_TRUE(is_te_spec_norm_name("decoder.layers.0.pre_mlp_layernorm.weight"));
  EXPECT_FALSE(is_te_spec_norm_name("decoder.layers.0.mlp.linear_fc1.layer_norm_weight"));
  for (const char* other : {"decoder.layers.mlp.linear_fc1.layer_norm_weight",  // a stacked key, not a per-layer name
                            "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", "decoder.final_layernorm.weight",
                            "decoder.layers.0.mlp.linear_fc1.weight"})
    EXPECT_EQ(other_spec_norm_name(other), "") << other;
}

}  // namespace megatron_core_key_model_test
