// The Hugging Face import plan (formats/hf/import_plan.h), without I/O: the export map read backwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "core/error.h"
#include "formats/hf/import_plan.h"

namespace hf_import_plan_test {

using namespace ucpkit;
using namespace ucpkit::formats::hf;

namespace {

// What LlamaForCausalLM(LlamaConfig(hidden 16, 4 heads, 2 KV heads, intermediate 32, 2 layers, vocab 64))
// holds, untied, bf16.
std::map<std::string, TensorShape> llama_tensors() {
  std::map<std::string, TensorShape> t;
  auto add = [&](const std::string& n, std::vector<int64_t> s) { t[n] = {DType::BFloat16, std::move(s)}; };
  add("model.embed_tokens.weight", {64, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {16});
    add(p + "self_attn.q_proj.weight", {16, 16});
    add(p + "self_attn.k_proj.weight", {8, 16});
    add(p + "self_attn.v_proj.weight", {8, 16});
    add(p + "self_attn.o_proj.weight", {16, 16});
    add(p + "post_attention_layernorm.weight", {16});
    add(p + "mlp.gate_proj.weight", {32, 16});
    add(p + "mlp.up_proj.weight", {32, 16});
    add(p + "mlp.down_proj.weight", {16, 32});
  }
  add("model.norm.weight", {16});
  add("lm_head.weight", {64, 16});
  return t;
}

nlohmann::json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 16}, {"intermediate_size", 32},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"head_dim", 4},
          {"max_position_embeddings", 16}, {"vocab_size", 64}, {"rms_norm_eps", 1e-5},
          {"rope_parameters", {{"rope_theta", 500000.0}, {"rope_type", "default"}}}, {"tie_word_embeddings", false},
          {"hidden_act", "silu"}, {"dtype", "bfloat16"}};
}

std::string what(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(HfImportPlan, LlamaTensorsJoinIntoMegatronCoreParameters) {
  const ImportPlan p = plan_hf_import(shipped_hf_families(), llama_config(), llama_tensors(), "m");
  EXPECT_EQ(p.family, "llama");
  ASSERT_EQ(p.params.size(), 3u + 2 * 6);  // embed, norm, head + per layer: 2 norms, qkv, proj, fc1, fc2
  const auto& qkv = *std::find_if(p.params.begin(), p.params.end(), [](const ImportParam& x) {
    return x.name == "decoder.layers.1.self_attention.linear_qkv.weight";
  });
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(qkv.merge, Split::Qkv);
  EXPECT_EQ(qkv.sources, (std::vector<std::string>{"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                                                   "model.layers.1.self_attn.v_proj.weight"}));
  EXPECT_EQ(qkv.dtype, DType::BFloat16);
  const auto& fc1 = *std::find_if(p.params.begin(), p.params.end(), [](const ImportParam& x) { return x.name == "decoder.layers.0.mlp.linear_fc1.weight"; });
  EXPECT_EQ(fc1.shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(p.facts["kv_heads"], 2);
  EXPECT_DOUBLE_EQ(p.facts["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(p.dtype, DType::BFloat16);
  EXPECT_EQ(p.to_json()["params"].size(), p.params.size());
}

TEST(HfImportPlan, TiedModelsHaveNoHead) {
  auto c = llama_config();
  c["tie_word_embeddings"] = true;
  auto t = llama_tensors();
  t.erase("lm_head.weight");
  const ImportPlan p = plan_hf_import(shipped_hf_families(), c, t, "m");
  EXPECT_EQ(p.params.size(), 1u + 1 + 2 * 6);
  // The config contradicting the tensors is refused naming both.
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); }).find("tie_word_embeddings is true but the folder holds lm_head.weight"),
            std::string::npos);
}

// What cannot be imported exactly: one message naming the file and the tensor.
TEST(HfImportPlan, RefusalsNameTheFileAndTheTensor) {
  auto c = llama_config();
  c["architectures"] = {"GPT2LMHeadModel"};
  const std::string arch = what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); });
  EXPECT_NE(arch.find("m/config.json: architectures [\"GPT2LMHeadModel\"] has no Hugging Face family map"), std::string::npos) << arch;
  EXPECT_NE(arch.find("llama (LlamaForCausalLM)"), std::string::npos) << arch;

  auto t = llama_tensors();
  t.erase("model.layers.1.self_attn.k_proj.weight");
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), llama_config(), t, "m"); }).find("tensor model.layers.1.self_attn.k_proj.weight is missing"),
            std::string::npos);

  t = llama_tensors();
  t.erase("model.layers.1.post_attention_layernorm.weight");  // a layer's norm is never optional
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), llama_config(), t, "m"); }).find("tensor model.layers.1.post_attention_layernorm.weight is missing"),
            std::string::npos);

  t = llama_tensors();
  t["model.layers.0.self_attn.rotary.inv_freq"] = {DType::Float32, {2}};
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), llama_config(), t, "m"); }).find("has no rule"), std::string::npos);

  c = llama_config();
  c["num_key_value_heads"] = 4;  // the config contradicts k_proj's rows
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); }).find("rows"), std::string::npos);

  c = llama_config();
  c["hidden_act"] = "gelu";
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); }).find("hidden_act"), std::string::npos);

  c = llama_config();
  c["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); }).find("rope type 'yarn'"), std::string::npos);

  c = llama_config();
  c.erase("hidden_size");
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); }).find("\"hidden_size\" is missing"), std::string::npos);
}

namespace {

// What MixtralForCausalLM's save_pretrained writes for the llama sizes above with 3 experts of 24.
std::map<std::string, TensorShape> mixtral_tensors() {
  std::map<std::string, TensorShape> t;
  for (auto [n, s] : llama_tensors())
    if (n.find(".mlp.") == std::string::npos) t[n] = {DType::Float32, s.shape};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".block_sparse_moe.";
    t[p + "gate.weight"] = {DType::Float32, {3, 16}};
    for (int e = 0; e < 3; ++e) {
      const std::string x = p + "experts." + std::to_string(e) + ".";
      t[x + "w1.weight"] = {DType::Float32, {24, 16}};
      t[x + "w3.weight"] = {DType::Float32, {24, 16}};
      t[x + "w2.weight"] = {DType::Float32, {16, 24}};
    }
  }
  return t;
}

nlohmann::json mixtral_config() {
  auto c = llama_config();
  c["architectures"] = {"MixtralForCausalLM"};
  c["intermediate_size"] = 24, c["num_local_experts"] = 3, c["num_experts_per_tok"] = 2, c["router_aux_loss_coef"] = 0.02;
  c["dtype"] = "float32";
  return c;
}

}  // namespace

TEST(HfImportPlan, MixtralExpertsBecomeMegatronCoreExpertsWithTheirFacts) {
  const ImportPlan p = plan_hf_import(shipped_hf_families(), mixtral_config(), mixtral_tensors(), "m");
  EXPECT_EQ(p.family, "mixtral");
  EXPECT_EQ(p.facts["experts"], 3);
  EXPECT_EQ(p.facts["moe_ffn"], 24);
  EXPECT_EQ(p.facts["moe_topk"], 2);
  EXPECT_EQ(p.facts["moe_aux_loss"], 0.02);
  EXPECT_EQ(p.facts["moe_pre_softmax"], false);  // Mixtral renormalises the top k: Megatron's default
  EXPECT_EQ(p.facts["shared_ffn"], 0);
  // embed, norm, head + per layer: 2 norms, qkv, proj, router, 3 x (fc1, fc2)
  ASSERT_EQ(p.params.size(), 3u + 2 * (5 + 6));
  const auto fc1 = std::find_if(p.params.begin(), p.params.end(), [](const ImportParam& x) {
    return x.name == "decoder.layers.1.mlp.experts.experts.2.linear_fc1.weight";
  });
  ASSERT_NE(fc1, p.params.end());
  EXPECT_EQ(fc1->shape, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(fc1->sources, (std::vector<std::string>{"model.layers.1.block_sparse_moe.experts.2.w1.weight",
                                                    "model.layers.1.block_sparse_moe.experts.2.w3.weight"}));
}

TEST(HfImportPlan, MoeRefusalsNameTheFileAndTheKey) {
  auto t = mixtral_tensors();
  t.erase("model.layers.1.block_sparse_moe.experts.2.w2.weight");  // an expert dropped
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), mixtral_config(), t, "m"); })
                .find("m: tensor model.layers.1.block_sparse_moe.experts.2.w2.weight is missing (config.json says 2 layers, 3 experts)"),
            std::string::npos);
  auto c = mixtral_config();
  c["num_local_experts"] = 4;  // the config says more experts than the folder holds
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, mixtral_tensors(), "m"); }).find("experts.3"), std::string::npos);
  c = mixtral_config();
  c["sliding_window"] = 4096;  // math Megatron-Core's GPTModel does not compute
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, mixtral_tensors(), "m"); }).find("m/config.json: \"sliding_window\" is 4096"),
            std::string::npos);
  c = mixtral_config();
  c["intermediate_size"] = 32;
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, mixtral_tensors(), "m"); }).find("expert intermediate size says 32"),
            std::string::npos);
  c = llama_config();
  c["attention_bias"] = true, c["mlp_bias"] = false;  // Megatron's one add_bias_linear
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, llama_tensors(), "m"); }).find("one setting for both"), std::string::npos);
}

// A folder in the fused expert layout reads as the same Megatron-Core parameters, each expert one
// element of the fused tensor's first axis.
TEST(HfImportPlan, FusedExpertsAreReadExpertByExpert) {
  std::map<std::string, TensorShape> t;
  for (auto [n, s] : mixtral_tensors())
    if (n.find(".block_sparse_moe.") == std::string::npos) t[n] = s;
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.";
    t[p + "gate.weight"] = {DType::Float32, {3, 16}};
    t[p + "experts.gate_up_proj"] = {DType::Float32, {3, 48, 16}};
    t[p + "experts.down_proj"] = {DType::Float32, {3, 16, 24}};
  }
  const ImportPlan fused = plan_hf_import(shipped_hf_families(), mixtral_config(), t, "m");
  const ImportPlan per_expert = plan_hf_import(shipped_hf_families(), mixtral_config(), mixtral_tensors(), "m");
  std::map<std::string, std::vector<int64_t>> a, b;
  for (const auto& x : fused.params) a[x.name] = x.shape;
  for (const auto& x : per_expert.params) b[x.name] = x.shape;
  EXPECT_EQ(a, b);
  const auto fc2 = std::find_if(fused.params.begin(), fused.params.end(), [](const ImportParam& x) {
    return x.name == "decoder.layers.1.mlp.experts.experts.2.linear_fc2.weight";
  });
  ASSERT_NE(fc2, fused.params.end());
  EXPECT_EQ(fc2->sources, std::vector<std::string>{"model.layers.1.mlp.experts.down_proj"});
  EXPECT_EQ(fc2->index, 2);
  t["model.layers.1.mlp.experts.gate_up_proj"] = {DType::Float32, {2, 48, 16}};  // an expert short
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), mixtral_config(), t, "m"); }).find("not [3 experts"), std::string::npos);
}

}  // namespace hf_import_plan_test

namespace hf_import_plan_test {
namespace {

// What Qwen2MoeForCausalLM's save_pretrained writes for the llama sizes above (QKV biases) with layer 0 dense
// (mlp_only_layers [0]) and layer 1 MoE: 3 experts of 24, a shared expert of 40 with its gate.
std::map<std::string, TensorShape> qwen2_moe_tensors() {
  std::map<std::string, TensorShape> t;
  for (auto [n, s] : llama_tensors())
    if (n.rfind("model.layers.1.mlp.", 0) != 0) t[n] = {DType::Float32, s.shape};
  for (const char* b : {"q_proj", "k_proj", "v_proj"})
    for (int l = 0; l < 2; ++l)
      t["model.layers." + std::to_string(l) + ".self_attn." + b + ".bias"] = {DType::Float32, {std::string(b) == "q_proj" ? 16 : 8}};
  const std::string p = "model.layers.1.mlp.";
  t[p + "gate.weight"] = {DType::Float32, {3, 16}};
  for (int e = 0; e < 3; ++e) {
    const std::string x = p + "experts." + std::to_string(e) + ".";
    t[x + "gate_proj.weight"] = t[x + "up_proj.weight"] = {DType::Float32, {24, 16}};
    t[x + "down_proj.weight"] = {DType::Float32, {16, 24}};
  }
  t[p + "shared_expert.gate_proj.weight"] = t[p + "shared_expert.up_proj.weight"] = {DType::Float32, {40, 16}};
  t[p + "shared_expert.down_proj.weight"] = {DType::Float32, {16, 40}};
  t[p + "shared_expert_gate.weight"] = {DType::Float32, {1, 16}};
  return t;
}

nlohmann::json qwen2_moe_config() {
  auto c = llama_config();
  c["architectures"] = {"Qwen2MoeForCausalLM"};
  c["moe_intermediate_size"] = 24, c["shared_expert_intermediate_size"] = 40, c["num_experts"] = 3;
  c["num_experts_per_tok"] = 2, c["norm_topk_prob"] = false, c["qkv_bias"] = true, c["mlp_only_layers"] = {0};
  c["decoder_sparse_step"] = 1, c["dtype"] = "float32";
  return c;
}

std::vector<std::string> names_of(const ImportPlan& p) {
  std::vector<std::string> n;
  for (const auto& x : p.params) n.push_back(x.name);
  return n;
}

bool has(const std::vector<std::string>& names, const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); }

}  // namespace

// The dense layer's MLP and the MoE layer's experts, shared expert and its gate, each under its Megatron-Core
// name; the facts carry the layer pattern and the shared expert for the args.
TEST(HfImportPlan, Qwen2MoeSharedExpertAndDenseLayersBecomeMegatronCoreParameters) {
  const ImportPlan p = plan_hf_import(shipped_hf_families(), qwen2_moe_config(), qwen2_moe_tensors(), "m");
  EXPECT_EQ(p.family, "qwen2_moe");
  EXPECT_EQ(p.facts["dense_layers"], nlohmann::json::array({0}));
  EXPECT_EQ(p.facts["shared_ffn"], 40);
  EXPECT_EQ(p.facts["shared_gate"], true);
  EXPECT_EQ(p.facts["qkv_bias"], true);
  EXPECT_EQ(p.facts["moe_pre_softmax"], true);
  const auto n = names_of(p);
  EXPECT_TRUE(has(n, "decoder.layers.0.mlp.linear_fc1.weight"));
  EXPECT_TRUE(has(n, "decoder.layers.0.mlp.linear_fc2.weight"));
  EXPECT_FALSE(has(n, "decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_FALSE(has(n, "decoder.layers.0.mlp.router.weight"));
  EXPECT_TRUE(has(n, "decoder.layers.1.mlp.shared_experts.gate_weight"));
  EXPECT_TRUE(has(n, "decoder.layers.1.mlp.experts.experts.2.linear_fc2.weight"));
  const auto fc1 = std::find_if(p.params.begin(), p.params.end(),
                                [](const ImportParam& x) { return x.name == "decoder.layers.1.mlp.shared_experts.linear_fc1.weight"; });
  ASSERT_NE(fc1, p.params.end());
  EXPECT_EQ(fc1->shape, (std::vector<int64_t>{80, 16}));
  EXPECT_EQ(fc1->sources, (std::vector<std::string>{"model.layers.1.mlp.shared_expert.gate_proj.weight",
                                                    "model.layers.1.mlp.shared_expert.up_proj.weight"}));
  // embedding, final norm, head; per layer input norm, QKV, its bias, o_proj, pre-MLP norm; layer 0 fc1, fc2;
  // layer 1 router, 3 x (fc1, fc2), the shared expert's fc1, fc2 and gate
  EXPECT_EQ(p.params.size(), 3u + 2 * 5 + 2 + 1 + 6 + 3);
}

// decoder_sparse_step as transformers reads it (the layers with (layer + 1) % step != 0 dense), joined with
// mlp_only_layers; sizes and layer numbers the tensors or the model contradict are refused naming the key.
TEST(HfImportPlan, Qwen2MoeLayerPatternAndSizesAreChecked) {
  auto c = qwen2_moe_config();
  c["mlp_only_layers"] = nlohmann::json::array();
  c["decoder_sparse_step"] = 2;  // layer 0 dense, layer 1 MoE: the same model
  EXPECT_EQ(names_of(plan_hf_import(shipped_hf_families(), c, qwen2_moe_tensors(), "m")),
            names_of(plan_hf_import(shipped_hf_families(), qwen2_moe_config(), qwen2_moe_tensors(), "m")));
  c["mlp_only_layers"] = {2};
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, qwen2_moe_tensors(), "m"); }).find("\"mlp_only_layers\" holds 2"),
            std::string::npos);
  c = qwen2_moe_config();
  c["mlp_only_layers"] = nlohmann::json::array();  // layer 0 MoE by the config: its router is missing
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, qwen2_moe_tensors(), "m"); }).find("model.layers.0.mlp.gate.weight is missing"),
            std::string::npos);
  c = qwen2_moe_config();
  c["shared_expert_intermediate_size"] = 48;
  EXPECT_NE(what([&] { plan_hf_import(shipped_hf_families(), c, qwen2_moe_tensors(), "m"); }).find("shared expert intermediate size says 48"),
            std::string::npos);
}

}  // namespace hf_import_plan_test
