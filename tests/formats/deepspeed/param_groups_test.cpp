// Megatron's weight-decay rule and DeepSpeed's expert group names, against the Python they copy.
#include <gtest/gtest.h>

#include "formats/deepspeed/param_groups.h"

namespace deepspeed_param_groups_test {

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

// Saved param_groups as torch's Optimizer.state_dict keeps them: the tutorial's dense group (no moe),
// its expert group ('moe': True, 'ep_size_<N>'), a group without name or weight_decay.
TEST(ParamGroups, SavedParamGroupsReadNameMoeAndWeightDecay) {
  using ucpkit::pickle::Value;
  auto dense = Value::dict();
  dense->set_item("name", Value::str("parameters"));
  dense->set_item("weight_decay", Value::real(0.01));
  auto expert = Value::dict();
  expert->set_item("name", Value::str("ep_size_2"));
  expert->set_item("moe", Value::boolean(true));
  expert->set_item("weight_decay", Value::integer(0));
  const auto g = saved_param_groups({dense, expert, Value::dict(), Value::none()});
  ASSERT_EQ(g.size(), 4u);
  EXPECT_EQ(g[0].name, "parameters");
  EXPECT_FALSE(g[0].moe);
  EXPECT_DOUBLE_EQ(g[0].weight_decay, 0.01);
  EXPECT_EQ(g[1].name, "ep_size_2");
  EXPECT_TRUE(g[1].moe);
  EXPECT_DOUBLE_EQ(g[1].weight_decay, 0.0);
  EXPECT_EQ(g[2].name, "");
  EXPECT_FALSE(g[3].moe);
}

// A target's expert group takes the target's ep_size_<N> name; dense groups, unnamed expert groups
// and non-dict entries are left alone (what ucp-load's writer does to the template's param_groups).
TEST(ParamGroups, RenameExpertGroupOnlyTouchesNamedExpertGroups) {
  using ucpkit::pickle::Value;
  auto dense = Value::dict();
  dense->set_item("name", Value::str("parameters"));
  auto expert = Value::dict();
  expert->set_item("name", Value::str("ep_size_2"));
  expert->set_item("moe", Value::boolean(true));
  auto unnamed = Value::dict();
  unnamed->set_item("moe", Value::boolean(true));
  for (const auto& g : {dense, expert, unnamed, Value::none()}) rename_expert_group(g, expert_group_name(4));
  EXPECT_EQ(dense->get("name")->s, "parameters");
  EXPECT_EQ(expert->get("name")->s, "ep_size_4");
  EXPECT_FALSE(unnamed->contains("name"));
}

// Megatron's model files: its args Namespace (with num_layers) or the nested module; a flat module
// without Megatron's args (a model saved by any other script) is not Megatron's.
TEST(ParamGroups, SavedByMegatronOnlyWithMegatronsArgsOrNestedModule) {
  using ucpkit::pickle::Value;
  auto flat = Value::dict();
  auto module = Value::dict(true);
  module->set_item("blocks.0.ln1.weight", Value::none());
  flat->set_item("module", module);
  EXPECT_FALSE(saved_by_megatron(flat));
  auto nested = Value::dict();
  auto lm = Value::dict();
  lm->set_item("language_model", Value::dict());
  nested->set_item("module", lm);
  EXPECT_TRUE(saved_by_megatron(nested));
  auto with_args = Value::dict();
  with_args->set_item("module", module);
  auto args = Value::make_object("argparse", "Namespace", Value::tuple(), Value::dict());
  with_args->set_item("args", args);
  EXPECT_FALSE(saved_by_megatron(with_args));  // a Namespace, but not Megatron's
  args->set_attr("num_layers", Value::integer(4));
  EXPECT_TRUE(saved_by_megatron(with_args));
  EXPECT_FALSE(saved_by_megatron(Value::none()));
}

// A fresh run's expert group (a Hugging Face import written as native DeepSpeed MoE): the dense group's settings,
// DeepSpeed's 'moe' flag and name, the dense group itself untouched.
TEST(ParamGroups, ExpertParamGroupCopiesTheDenseGroupsSettings) {
  using ucpkit::pickle::Value;
  auto dense = Value::dict();
  dense->set_item("weight_decay", Value::real(0.01));
  dense->set_item("params", Value::list({Value::integer(0)}));
  const auto g = ucpkit::formats::deepspeed::expert_param_group(dense, 2, 5);
  EXPECT_DOUBLE_EQ(g->get("weight_decay")->as_float(), 0.01);
  EXPECT_TRUE(g->get("moe")->b);
  EXPECT_EQ(g->get("name")->s, "ep_size_2");
  EXPECT_EQ(g->get("params")->items.at(0)->i, 5);
  EXPECT_FALSE(dense->contains("moe"));
  const auto saved = ucpkit::formats::deepspeed::saved_param_groups({dense, g});
  EXPECT_FALSE(saved[0].moe);
  EXPECT_TRUE(saved[1].moe);
}

}  // namespace deepspeed_param_groups_test
