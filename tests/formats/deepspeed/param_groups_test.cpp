// Megatron's weight-decay rule and DeepSpeed's expert group names, against the Python they copy.
#include <gtest/gtest.h>

#include "formats/deepspeed/param_groups.h"

using namespace ucpkit::formats::deepspeed;

// Megatron-DeepSpeed megatron/optimizer/__init__.py:39-40:
//   no_wd = name.endswith(".bias") or len(param.shape) == 1
TEST(ParamGroups, MegatronDecayRule) {
  EXPECT_TRUE(megatron_weight_decay("language_model.encoder.layers.0.mlp.dense_h_to_4h.weight", {64, 32}));
  EXPECT_FALSE(megatron_weight_decay("language_model.encoder.layers.0.mlp.dense_h_to_4h.bias", {64}));
  EXPECT_FALSE(megatron_weight_decay("language_model.encoder.final_layernorm.weight", {32}));
  // The case the two old spellings disagreed on: a 2-D bias ends with ".bias", so no weight decay
  // (reshard/model_info.cpp's `shape.size() >= 2` put it into the decay group).
  EXPECT_TRUE(megatron_weight_decay("language_model.encoder.layers.0.self_attention.rel_bias", {4, 16}));
  EXPECT_FALSE(megatron_weight_decay("language_model.encoder.layers.0.self_attention.dense.bias", {4, 16}));
  EXPECT_EQ(megatron_group_slot("language_model.encoder.layers.0.self_attention.dense.bias", {4, 16}), 1);
  // len(()) == 0 is not 1 and the name has no ".bias": a 0-D parameter is decayed.
  EXPECT_TRUE(megatron_weight_decay("language_model.scale", {}));
  EXPECT_EQ(megatron_group_slot("language_model.scale", {}), 0);
  // endswith(".bias"), not a substring: "bias_gate" and a bare "bias" are names like any other.
  EXPECT_TRUE(megatron_weight_decay("layers.0.bias_gate", {8, 8}));
  EXPECT_TRUE(megatron_weight_decay("bias", {8, 8}));
}

// deepspeed/moe/layer.py:61: self.expert_group_name = f"ep_size_{self.ep_size}"
TEST(ParamGroups, ExpertGroupNames) {
  EXPECT_EQ(expert_group_name(4), "ep_size_4");
  EXPECT_EQ(expert_group_name(16), "ep_size_16");
  EXPECT_EQ(ep_size_of_group_name("ep_size_4"), 4);
  EXPECT_EQ(ep_size_of_group_name("ep_size_128"), 128);
  EXPECT_EQ(ep_size_of_group_name("wd_no_scale_lr_ep_size_2"), 2);
  EXPECT_EQ(ep_size_of_group_name(expert_group_name(7)), 7);
  EXPECT_FALSE(ep_size_of_group_name("wd_no_scale_lr"));
  EXPECT_FALSE(ep_size_of_group_name("ep_size_"));
  EXPECT_FALSE(ep_size_of_group_name(""));
}
