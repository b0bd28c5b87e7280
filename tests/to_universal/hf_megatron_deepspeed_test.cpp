// lib/to_universal/hf_megatron_deepspeed: the fresh Megatron-DeepSpeed run's template of a Hugging Face import, as
// plain data (no I/O): GPTModelPipe's names and layer numbering, the layer files' keys, the TP patterns, Megatron's
// two param groups, the args of a run at iteration 0, and the refusals. The round trip through Megatron-DeepSpeed at
// TP 2 x PP 2 x DP 2, judged by transformers, is tests/frameworks/hf_import_test.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/deepspeed/model_states.h"
#include "support/errors.h"
#include "to_universal/hf_megatron_deepspeed.h"

namespace ucpkit::to_universal {
namespace hf_megatron_deepspeed_test {
namespace {

using nlohmann::json;
using pickle::Value;
using ucpkit::testing::error_of;

// A Llama with GQA: hidden 32, 4 heads of 8 in 2 groups, ffn 48, 2 layers.
json llama(bool tied = false) {
  return {{"hidden", 32},     {"ffn", 48},          {"layers", 2},        {"heads", 4},          {"kv_heads", 2},
          {"head_dim", 8},    {"max_positions", 64}, {"norm_eps", 1e-5},  {"rope_theta", 500000.0}, {"rope_llama3_factor", 0.0},
          {"tied", tied},     {"linear_bias", false}, {"qkv_bias", false}, {"qk_norm", false},    {"experts", 0}};
}

// Mixtral: the same attention, 4 experts of 40 in every layer, top 2.
json mixtral() {
  json f = llama();
  f["experts"] = 4;
  f["moe_ffn"] = 40;
  f["moe_topk"] = 2;
  f["dense_layers"] = json::array();
  f["shared_ffn"] = 0;
  return f;
}

pickle::ValuePtr groups() {
  auto g = [](double wd) {
    auto d = Value::dict();
    d->set_item("lr", Value::real(0.0));
    d->set_item("weight_decay", Value::real(wd));
    d->set_item("wd_mult", Value::real(1.0));  // a Megatron-Core key, not DeepSpeed's: left out
    return d;
  };
  return Value::list({g(0.01), g(0.0)});
}

std::vector<std::string> names(const FreshMegatronDeepSpeed& f) {
  std::vector<std::string> out;
  for (const auto& p : f.manifest.params) out.push_back(p.name);
  return out;
}

TEST(FreshMegatronDeepSpeed, UntiedLlamaHasGptModelPipesNamesLayerKeysAndPatterns) {
  const auto f = fresh_megatron_deepspeed(llama(), 100, DType::BFloat16, groups(), "hf");
  const std::vector<std::string> block = {"input_layernorm.weight", "self_attention.query_key_value.weight",
                                          "self_attention.dense.weight", "post_attention_layernorm.weight",
                                          "mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.weight"};
  std::vector<std::string> want = {"1.word_embeddings.weight"};
  for (const char* b : {"2.", "3."})
    for (const auto& k : block) want.push_back(b + k);
  want.push_back("4.weight");
  want.push_back("5.lm_head.weight");
  EXPECT_EQ(names(f), want);
  const auto& src = f.manifest.source;
  ASSERT_TRUE(src.layer_keys.has_value());
  EXPECT_EQ(src.layer_keys->at(2), block);
  EXPECT_EQ(src.layer_keys->at(4), std::vector<std::string>{"weight"});
  EXPECT_EQ(src.layer_keys->at(5), std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(src.pipeline_numbering["first_block"], 2);
  EXPECT_EQ(src.pipeline_numbering["final_norm"], 4);
  EXPECT_EQ(src.pipeline_numbering["tied_head"], -1);
  EXPECT_TRUE(src.weights_only.value_or(false));
  EXPECT_TRUE(src.pipeline.value_or(false));
  // Shapes at TP 1, the joins the writer slices by: QKV as [Q; K; V] sub-params, SwiGLU's two halves, rows.
  const auto& qkv = f.manifest.params[2];
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(qkv.join, "sub_params");
  EXPECT_EQ(f.manifest.params[5].join.value_or(""), "two_sub_params");
  EXPECT_EQ(f.manifest.params[5].cat_dim, 0);
  EXPECT_EQ(f.manifest.params[3].cat_dim, 1);  // self_attention.dense: row parallel
  EXPECT_TRUE(f.manifest.params.front().vocab_tensor);
  EXPECT_TRUE(f.manifest.params.back().vocab_tensor);
  EXPECT_EQ(f.manifest.patterns_set["padded_vocab_size"], 128);
  EXPECT_EQ(f.manifest.patterns_set["original_vocab_size"], 100);
}

TEST(FreshMegatronDeepSpeed, TheModelFileIsAFreshRunsWithMegatronDeepSpeedsArgs) {
  const auto f = fresh_megatron_deepspeed(llama(), 100, DType::BFloat16, groups(), "hf");
  const auto m = formats::deepspeed::read_rank_model_states(f.model_states, "mp_rank_00_model_states.pt");
  EXPECT_TRUE(m.module.empty());  // a pipeline's module is None: the layer files hold it
  EXPECT_TRUE(m.get("module") && m.get("module")->is_none());
  ASSERT_TRUE(m.param_shapes.has_value());
  ASSERT_EQ(m.param_shapes->size(), 2u);  // Megatron's groups: the matrices (weight decay), the norms (none)
  EXPECT_EQ(m.param_shapes->at(0).size(), 2u + 2 * 4);
  EXPECT_EQ(m.param_shapes->at(1).size(), 2u * 2 + 1);
  EXPECT_EQ(m.get("iteration")->i, 0);
  EXPECT_EQ(m.get("global_steps")->i, 0);
  EXPECT_TRUE(m.get("lr_scheduler")->is_none());
  EXPECT_FALSE(m.contains("rng_state"));
  const auto args = m.args();
  ASSERT_TRUE(args);
  EXPECT_EQ(args->attr("num_key_value_heads")->i, 2);
  EXPECT_EQ(args->attr("rope_theta")->i, 500000);
  EXPECT_EQ(args->attr("padded_vocab_size")->i, 128);
  EXPECT_EQ(args->attr("normalization")->s, "rmsnorm");
  EXPECT_TRUE(args->attr("untie_embeddings_and_output_weights")->b);
  EXPECT_TRUE(args->attr("bf16")->b);
  // DeepSpeed's universal optimizer state: the import's hyper-parameters, DeepSpeed's keys only.
  const auto pg = f.optimizer_state->get("param_groups");
  ASSERT_EQ(pg->items.size(), 2u);
  EXPECT_DOUBLE_EQ(pg->items[0]->get("weight_decay")->as_float(), 0.01);
  EXPECT_FALSE(pg->items[0]->contains("wd_mult"));
  EXPECT_EQ(pg->items[1]->get("params")->items.at(0)->i, 1);
}

TEST(FreshMegatronDeepSpeed, TiedEmbeddingsAreOneTiedModuleWithTheHeadLayerFile) {
  const auto f = fresh_megatron_deepspeed(llama(true), 100, DType::Float32, groups(), "hf");
  const auto n = names(f);
  EXPECT_EQ(n.front(), "tied_modules.embed.word_embeddings.weight");
  EXPECT_EQ(n.back(), "4.weight");  // no lm_head: the tied embedding on the last stage computes the logits
  EXPECT_EQ(f.manifest.source.layer_keys->at(5), std::vector<std::string>{"word_embeddings.weight"});
  EXPECT_EQ(f.manifest.source.pipeline_numbering["tied_head"], 5);
  EXPECT_EQ(f.manifest.source.pipeline_numbering["embedding"], 1);
  EXPECT_EQ(f.manifest.patterns_set["pipeline_replicated_parameter_patterns"],
            json::array({"tied_modules.embed.word_embeddings.weight"}));
}

TEST(FreshMegatronDeepSpeed, AnMoeIsGptModelWithNativeExpertsInAThirdOptimizerGroup) {
  const auto f = fresh_megatron_deepspeed(mixtral(), 100, DType::Float32, groups(), "hf");
  const auto& src = f.manifest.source;
  EXPECT_FALSE(src.pipeline.value_or(true));
  EXPECT_EQ(src.num_experts, (std::vector<int>{4, 4}));
  EXPECT_EQ(src.expert_files, 8);
  EXPECT_EQ(src.ds_line, "0.19.5");
  EXPECT_FALSE(src.layer_keys.has_value());
  int experts = 0;
  for (const auto& p : f.manifest.params)
    if (p.expert) {
      ++experts;
      EXPECT_NE(p.name.find("deepspeed_experts." + std::to_string(p.expert->global_id) + "."), std::string::npos) << p.name;
    }
  EXPECT_EQ(experts, 2 * 4 * 2);
  const auto pg = f.optimizer_state->get("param_groups");
  ASSERT_EQ(pg->items.size(), 3u);
  EXPECT_TRUE(pg->items[2]->get("moe")->b);
  EXPECT_EQ(pg->items[2]->get("name")->s, "ep_size_1");
  EXPECT_DOUBLE_EQ(pg->items[2]->get("weight_decay")->as_float(), 0.01);
  const auto m = formats::deepspeed::read_rank_model_states(f.model_states, "mp_rank_00_model_states.pt");
  EXPECT_EQ(m.args()->attr("topk")->i, 2);
  EXPECT_EQ(m.args()->attr("ffn_hidden_size")->i, 40);
}

TEST(FreshMegatronDeepSpeed, WhatGptModelPipeHasNoPlaceForIsRefusedNamingIt) {
  auto with = [](const char* key, json v) {
    json f = llama();
    f[key] = v;
    return f;
  };
  auto moe = [](json dense) {
    json f = mixtral();
    f["dense_layers"] = dense;
    return f;
  };
  const std::pair<json, std::string> cases[] = {
      {moe(json::array({1})), "dense layers between the MoE layers"}, {with("qkv_bias", true), "query/key/value bias"},
      {with("qk_norm", true), "query and key norms"}, {with("linear_bias", true), "biases on the linear layers"},
      {with("rope_llama3_factor", 8.0), "rope scaling"},
      {with("rope_theta", 10000.5), "not an integer"},
      {[&] { json f = mixtral(); f["shared_ffn"] = 16; return f; }(), "a shared expert"}};
  for (const auto& [facts, what] : cases) {
    const std::string e = error_of([&] { fresh_megatron_deepspeed(facts, 100, DType::BFloat16, groups(), "my_hf"); });
    EXPECT_NE(e.find("my_hf: "), std::string::npos) << e;
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_NE(e.find("GPT has no place"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace hf_megatron_deepspeed_test
}  // namespace ucpkit::to_universal
