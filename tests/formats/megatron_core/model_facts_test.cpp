// Model facts from Megatron-Core args (formats/megatron_core/model_facts.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "formats/megatron_core/model_facts.h"
#include "io/pickle/value.h"

namespace megatron_core_model_facts_test {

using namespace ucpkit;
using pickle::Value;

namespace {

// The args of the llama_gqa_tp2_dp2_v016 fixture (core_v0.16.1 common.pt), the ones the facts read.
pickle::ValuePtr llama_common() {
  auto a = Value::make_object("argparse", "Namespace", Value::tuple(), Value::dict(), pickle::Object::Build::NewObj);
  a->set_attr("hidden_size", Value::integer(16));
  a->set_attr("ffn_hidden_size", Value::integer(32));
  a->set_attr("num_layers", Value::integer(2));
  a->set_attr("num_attention_heads", Value::integer(4));
  a->set_attr("group_query_attention", Value::boolean(true));
  a->set_attr("num_query_groups", Value::integer(2));
  a->set_attr("kv_channels", Value::integer(4));
  a->set_attr("max_position_embeddings", Value::integer(16));
  a->set_attr("rotary_base", Value::integer(10000));
  a->set_attr("rotary_percent", Value::real(1.0));
  a->set_attr("position_embedding_type", Value::str("rope"));
  a->set_attr("normalization", Value::str("RMSNorm"));
  a->set_attr("swiglu", Value::boolean(true));
  a->set_attr("add_bias_linear", Value::boolean(false));
  a->set_attr("add_qkv_bias", Value::boolean(false));
  a->set_attr("untie_embeddings_and_output_weights", Value::boolean(true));
  a->set_attr("num_experts", Value::none());
  auto c = Value::dict();
  c->set_item("args", a);
  return c;
}

}  // namespace

TEST(McoreModelFacts, ReadsTheSizesAndTheAttentionForm) {
  const auto f = formats::megatron_core::model_facts(llama_common(), "common.pt");
  EXPECT_EQ(f["hidden"], 16);
  EXPECT_EQ(f["ffn"], 32);
  EXPECT_EQ(f["heads"], 4);
  EXPECT_EQ(f["kv_heads"], 2);
  EXPECT_EQ(f["head_dim"], 4);
  EXPECT_EQ(f["tied"], false);
  EXPECT_EQ(f["linear_bias"], false);
  EXPECT_EQ(f["experts"], 0);
  EXPECT_DOUBLE_EQ(f["rope_theta"].get<double>(), 10000.0);
  EXPECT_DOUBLE_EQ(f["norm_eps"].get<double>(), 1e-5);  // Megatron's default when the args do not say
}

TEST(McoreModelFacts, WithoutGqaTheKvHeadsAreTheHeads) {
  auto c = llama_common();
  c->get("args")->set_attr("group_query_attention", Value::boolean(false));
  EXPECT_EQ(formats::megatron_core::model_facts(c, "common.pt")["kv_heads"], 4);
}

namespace {

// model_facts of `c` with args.<arg> = value: an Error naming the arg and the file.
void expect_refused(const pickle::ValuePtr& c, const char* arg, const pickle::ValuePtr& value) {
  c->get("args")->set_attr(arg, value);
  try {
    formats::megatron_core::model_facts(c, "common.pt");
    ADD_FAILURE() << arg << " accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::string("args.") + arg), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("common.pt"), std::string::npos) << e.what();
  }
}

}  // namespace

// A model whose math no Hugging Face configuration states is refused naming the arg, never exported
// into a config that computes something else.
TEST(McoreModelFacts, RefusesWhatNoConfigurationStates) {
  const std::pair<const char*, pickle::ValuePtr> cases[] = {
      {"position_embedding_type", Value::str("learned_absolute")},
      {"normalization", Value::str("LayerNorm")},
      {"swiglu", Value::boolean(false)},
      {"rotary_interleaved", Value::boolean(true)},
      {"rotary_percent", Value::real(0.5)},
      {"layernorm_zero_centered_gamma", Value::boolean(true)},
  };
  for (const auto& [arg, value] : cases) expect_refused(llama_common(), arg, value);
  auto c = llama_common();
  c->get("args")->set_attr("hidden_size", Value::none());
  EXPECT_THROW(formats::megatron_core::model_facts(c, "common.pt"), Error);
}

// MoE: the router's form is a fact (Qwen3-MoE's norm_topk_prob); routing math no Hugging Face MoE family
// computes is refused naming the arg, and Megatron args made from the facts state the experts.
TEST(McoreModelFacts, MoeRoutingIsAFactOrARefusal) {
  auto moe = [] {
    auto c = llama_common();
    c->get("args")->set_attr("num_experts", Value::integer(4));
    c->get("args")->set_attr("moe_ffn_hidden_size", Value::integer(24));
    c->get("args")->set_attr("moe_router_topk", Value::integer(2));
    return c;
  };
  auto f = formats::megatron_core::model_facts(moe(), "common.pt");
  EXPECT_EQ(f["experts"], 4);
  EXPECT_EQ(f["moe_ffn"], 24);
  EXPECT_EQ(f["moe_pre_softmax"], false);
  auto c = moe();
  c->get("args")->set_attr("moe_router_pre_softmax", Value::boolean(true));
  EXPECT_EQ(formats::megatron_core::model_facts(c, "common.pt")["moe_pre_softmax"], true);
  const std::pair<const char*, pickle::ValuePtr> cases[] = {
      {"moe_router_score_function", Value::str("sigmoid")},
      {"moe_router_enable_expert_bias", Value::boolean(true)},
      {"moe_router_topk_scaling_factor", Value::real(2.5)},
      {"moe_router_num_groups", Value::integer(8)},
      {"moe_expert_capacity_factor", Value::real(1.0)},
      {"moe_layer_freq", Value::list({Value::integer(1)})},  // a pattern of another length than the 2 layers
  };
  for (const auto& [arg, value] : cases) expect_refused(moe(), arg, value);
  f["vocab"] = 64;  // from config.json on import
  const auto args = formats::megatron_core::megatron_args(f, DType::Float32);
  EXPECT_EQ(args->attr("num_experts")->i, 4);
  EXPECT_EQ(args->attr("moe_ffn_hidden_size")->i, 24);
  EXPECT_EQ(args->attr("moe_router_topk")->i, 2);
  EXPECT_FALSE(args->attr("moe_grouped_gemm")->b);
  EXPECT_EQ(args->attr("moe_layer_freq")->i, 1);
}

// Dense layers between MoE layers (--moe-layer-freq as gpt_layer_specs.py reads it: an int N makes layer i MoE
// when i % N == 0, a list is the pattern) and the gated shared expert are facts, and the args made from them
// state them again.
TEST(McoreModelFacts, LayerPatternAndSharedExpertAreFacts) {
  auto c = llama_common();
  auto a = c->get("args");
  a->set_attr("num_layers", Value::integer(4));
  a->set_attr("num_experts", Value::integer(4));
  a->set_attr("moe_layer_freq", Value::integer(2));
  a->set_attr("moe_shared_expert_intermediate_size", Value::integer(40));
  a->set_attr("moe_shared_expert_gate", Value::boolean(true));
  auto f = formats::megatron_core::model_facts(c, "common.pt");
  EXPECT_EQ(f["dense_layers"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(f["shared_ffn"], 40);
  EXPECT_EQ(f["shared_gate"], true);
  a->set_attr("moe_layer_freq", Value::list({Value::integer(0), Value::integer(1), Value::integer(1), Value::integer(1)}));
  f = formats::megatron_core::model_facts(c, "common.pt");
  EXPECT_EQ(f["dense_layers"], nlohmann::json::array({0}));
  f["vocab"] = 64;
  const auto args = formats::megatron_core::megatron_args(f, DType::Float32);
  const auto freq = args->attr("moe_layer_freq");
  ASSERT_TRUE(freq->is(pickle::Kind::List));
  std::vector<int64_t> pattern;
  for (const auto& v : freq->items) pattern.push_back(v->i);
  EXPECT_EQ(pattern, (std::vector<int64_t>{0, 1, 1, 1}));
  EXPECT_EQ(args->attr("moe_shared_expert_intermediate_size")->i, 40);
  EXPECT_TRUE(args->attr("moe_shared_expert_gate")->b);
  a->set_attr("moe_layer_freq", Value::list({Value::integer(0), Value::integer(2), Value::integer(1), Value::integer(1)}));
  EXPECT_THROW(formats::megatron_core::model_facts(c, "common.pt"), Error);
}

}  // namespace megatron_core_model_facts_test
