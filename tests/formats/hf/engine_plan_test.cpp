// The DeepSpeed engine's parameter order of a transformers model (formats/hf/engine_plan.h): the shipped
// maps' module_order against transformers 5.24.0's named_parameters() of each family (printed from the
// models themselves, docs/hf.md "DeepSpeed output").
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "formats/hf/engine_plan.h"

namespace hf_engine_plan_test {

using namespace ucpkit;
using namespace ucpkit::formats::hf;

Family shipped(const std::string& family) {
  for (const auto& f : shipped_hf_families())
    if (f.family == family) return f;
  throw Error("no shipped map " + family);
}

std::vector<std::string> ordered(const Family& f, std::vector<std::string> names) {
  std::vector<std::string> shuffled(names.rbegin(), names.rend());
  std::vector<std::string> out;
  for (size_t i : engine_order(f, shuffled, "test")) out.push_back(shuffled[i]);
  return out;
}

TEST(HfEnginePlan, Qwen3MoeOrderIsTransformersNamedParameters) {
  // Qwen3MoeForCausalLM, layer 0 dense (mlp_only_layers [0]), layer 1 MoE: Qwen3MoeSparseMoeBlock registers its
  // experts before its router.
  const std::vector<std::string> expected = {
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
      "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
      "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
      "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
      "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
      "model.layers.1.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
      "model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj", "model.layers.1.mlp.gate.weight",
      "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
      "model.norm.weight", "lm_head.weight"};
  EXPECT_EQ(ordered(shipped("qwen3_moe"), expected), expected);
}

TEST(HfEnginePlan, LayersSortNumericallyAndBiasesFollowTheirWeights) {
  std::vector<std::string> expected = {"model.embed_tokens.weight"};
  for (int l : {0, 1, 2, 10})
    for (const char* p : {"q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias",
                          "o_proj.weight"})
      expected.push_back("model.layers." + std::to_string(l) + ".self_attn." + p);
  expected.push_back("model.norm.weight");
  EXPECT_EQ(ordered(shipped("qwen2"), expected), expected);
}

TEST(HfEnginePlan, EveryShippedMapHasAModuleOrderAndUnknownNamesAreRefused) {
  for (const auto& f : shipped_hf_families()) EXPECT_FALSE(f.module_order.empty()) << f.family;
  const Family f = shipped("llama");
  try {
    engine_order(f, {"model.embed_tokens.weight", "model.layers.0.self_attn.rotary.weight"}, "in");
    FAIL() << "an unknown name was placed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.self_attn.rotary.weight"), std::string::npos) << e.what();
  }
  Family none = f;
  none.module_order.clear();
  EXPECT_THROW(engine_order(none, {"model.embed_tokens.weight"}, "in"), Error);
}

}  // namespace hf_engine_plan_test
