// Hugging Face family maps (formats/hf/family_map.h): parsing, name matching, which layers a rule is for.
#include <gtest/gtest.h>

#include "core/error.h"
#include "formats/hf/family_map.h"

namespace hf_family_map_test {

using namespace ucpkit;
using namespace ucpkit::formats::hf;

TEST(HfFamilyMap, MalformedMapsAreRefusedNamingTheKey) {
  const auto base = nlohmann::json::parse(shipped_hf_map_texts().front().second);
  auto bad = base;
  bad["params"][2]["hf"] = nlohmann::json::array({"a", "b"});  // a qkv split makes three tensors
  EXPECT_THROW(Family::from_json(bad, "m.json"), Error);
  bad = base;
  bad["format"] = "other";
  EXPECT_THROW(Family::from_json(bad, "m.json"), Error);
  bad = base;
  bad["params"][0]["megatron_core"] = "embedding.{E}.weight";
  EXPECT_THROW(Family::from_json(bad, "m.json"), Error);
  bad = base;
  bad["params"][0]["split"] = "rows";
  EXPECT_THROW(Family::from_json(bad, "m.json"), Error);
  // Every shipped map parses and names its sources.
  for (const auto& [name, text] : shipped_hf_map_texts()) {
    const auto j = nlohmann::json::parse(text);
    EXPECT_NO_THROW(Family::from_json(j, name));
    EXPECT_TRUE(j.contains("sources")) << name;
  }
}

TEST(HfFamilyMap, ExpertPlaceholdersMustBeOnBothSides) {
  nlohmann::json j = {{"format", "ucpkit-hf-map"}, {"family", "x"}, {"model_type", "x"}, {"architectures", "X"},
                      {"params", {{{"megatron_core", "decoder.layers.{L}.mlp.experts.experts.{E}.linear_fc2.weight"},
                                   {"hf", "model.layers.{L}.mlp.experts.down_proj"}}}}};
  EXPECT_THROW(Family::from_json(j, "m.json"), Error);
  j["params"][0]["hf"] = "model.layers.{L}.mlp.experts.{E}.down_proj.weight";
  const Family f = Family::from_json(j, "m.json");
  const auto m = match_rule(f, "decoder.layers.3.mlp.experts.experts.7.linear_fc2.weight");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->layer, 3);
  EXPECT_EQ(m->expert, 7);
  EXPECT_EQ(hf_names(f, *m), std::vector<std::string>{"model.layers.3.mlp.experts.7.down_proj.weight"});
  j["params"][0]["megatron_core"] = "decoder.layers.{L}.mlp.experts.experts.{X}.linear_fc2.weight";
  EXPECT_THROW(Family::from_json(j, "m.json"), Error);
}

// A rule for the MoE or the dense layers only (a model with dense layers between its MoE layers): the facts'
// dense_layers decide; a dense model has no MoE layer. An unknown kind, or an ffn fact on a rule that is no
// gate_up split, is refused naming the rule.
TEST(HfFamilyMap, RulesForMoeOrDenseLayersFollowTheLayerPattern) {
  nlohmann::json j = {{"format", "ucpkit-hf-map"}, {"family", "x"}, {"model_type", "x"}, {"architectures", "X"},
                      {"params", {{{"megatron_core", "decoder.layers.{L}.mlp.linear_fc1.weight"},
                                   {"hf", {"model.layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.up_proj.weight"}},
                                   {"split", "gate_up"}, {"layers", "dense"}},
                                  {{"megatron_core", "decoder.layers.{L}.mlp.shared_experts.linear_fc1.weight"},
                                   {"hf", {"model.layers.{L}.mlp.shared_expert.gate_proj.weight",
                                           "model.layers.{L}.mlp.shared_expert.up_proj.weight"}},
                                   {"split", "gate_up"}, {"layers", "moe"}, {"ffn", "shared_ffn"}},
                                  {{"megatron_core", "decoder.final_layernorm.weight"}, {"hf", "model.norm.weight"}}}}};
  const Family f = Family::from_json(j, "m.json");
  const nlohmann::json facts = {{"experts", 4}, {"dense_layers", {0, 2}}};
  EXPECT_TRUE(moe_layer(facts, 1));
  EXPECT_FALSE(moe_layer(facts, 2));
  EXPECT_FALSE(moe_layer({{"experts", 0}}, 1));
  EXPECT_TRUE(moe_layer({{"experts", 4}}, 1));  // no pattern: every layer
  EXPECT_TRUE(rule_for_layer(f.rules[0], facts, 0));
  EXPECT_FALSE(rule_for_layer(f.rules[0], facts, 1));
  EXPECT_TRUE(rule_for_layer(f.rules[1], facts, 3));
  EXPECT_FALSE(rule_for_layer(f.rules[1], facts, 2));
  EXPECT_TRUE(rule_for_layer(f.rules[2], facts, -1));
  EXPECT_EQ(ffn_fact(f.rules[0]), "ffn");
  EXPECT_EQ(ffn_fact(f.rules[1]), "shared_ffn");
  auto bad = j;
  bad["params"][0]["layers"] = "sparse";
  EXPECT_THROW(Family::from_json(bad, "m.json"), Error);
  bad = j;
  bad["params"][2]["ffn"] = "ffn";
  EXPECT_THROW(Family::from_json(bad, "m.json"), Error);
}

}  // namespace hf_family_map_test
