// The Hugging Face export plan, family maps and config.json (formats/hf), without I/O.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "formats/hf/config.h"
#include "formats/hf/export_plan.h"
#include "formats/hf/family_map.h"

namespace hf_export_plan_test {

using namespace ucpkit;
using namespace ucpkit::formats::hf;

namespace {

// The Megatron-Core names and shapes of the llama_gqa_tp2_dp2_v016 fixture (ucp-union of it): hidden
// 16, 4 heads in 2 query groups of head_dim 4, SwiGLU ffn 32, padded vocabulary 96, untied.
ExportInput llama_input() {
  ExportInput in;
  auto add = [&](std::string n, std::vector<int64_t> s) { in.names.push_back(std::move(n)), in.shapes.push_back(std::move(s)); };
  add("embedding.word_embeddings.weight", {96, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    add(p + "self_attention.linear_proj.weight", {16, 16});
    add(p + "self_attention.linear_qkv.weight", {32, 16});
    add(p + "mlp.linear_fc1.weight", {64, 16});
    add(p + "mlp.linear_fc2.weight", {16, 32});
    add(p + "self_attention.linear_qkv.layer_norm_weight", {16});
    add(p + "mlp.linear_fc1.layer_norm_weight", {16});
  }
  add("decoder.final_layernorm.weight", {16});
  add("output_layer.weight", {96, 16});
  return in;
}

nlohmann::json llama_facts() {
  return {{"hidden", 16}, {"ffn", 32},        {"layers", 2},          {"heads", 4},        {"kv_heads", 2},
          {"head_dim", 4}, {"max_positions", 16}, {"norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"rope_llama3_factor", 0.0},
          {"tied", false}, {"linear_bias", false}, {"qkv_bias", false}, {"qk_norm", false}, {"experts", 0},
          {"moe_ffn", 32}, {"moe_topk", 2},        {"shared_ffn", 0}};
}

const Piece& tensor(const ExportPlan& p, const std::string& name) {
  const auto it = std::find_if(p.tensors.begin(), p.tensors.end(), [&](const Piece& t) { return t.name == name; });
  if (it == p.tensors.end()) throw Error("no tensor " + name);
  return *it;
}

}  // namespace

TEST(HfExportPlan, LlamaGqaSplitsQkvAndSwigluIntoTheHuggingFaceTensors) {
  const ExportPlan p = plan_hf_export(shipped_hf_families(), llama_facts(), llama_input(), DType::BFloat16, 5ull << 30, "in");
  EXPECT_EQ(p.family, "llama");
  // What LlamaForCausalLM holds for this config: embed, 9 per layer, norm, lm_head.
  ASSERT_EQ(p.tensors.size(), 21u);
  EXPECT_EQ(p.tensors.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(p.tensors.back().name, "lm_head.weight");
  const Piece& q = tensor(p, "model.layers.1.self_attn.q_proj.weight");
  const Piece& k = tensor(p, "model.layers.1.self_attn.k_proj.weight");
  const Piece& v = tensor(p, "model.layers.1.self_attn.v_proj.weight");
  EXPECT_EQ(q.shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(k.shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(v.shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(q.split, Split::Qkv);
  EXPECT_EQ(q.row0, 0);  // rows of [Q; K; V] after the regroup
  EXPECT_EQ(k.row0, 16);
  EXPECT_EQ(v.row0, 24);
  const Piece& gate = tensor(p, "model.layers.0.mlp.gate_proj.weight");
  const Piece& up = tensor(p, "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(gate.row0, 0);
  EXPECT_EQ(up.row0, 32);
  EXPECT_EQ(up.shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(tensor(p, "model.layers.0.input_layernorm.weight").shape, std::vector<int64_t>{16});
  EXPECT_EQ(tensor(p, "model.layers.0.post_attention_layernorm.weight").shape, std::vector<int64_t>{16});
  EXPECT_EQ(p.files, std::vector<std::string>{"model.safetensors"});
  // embed, per layer (input norm, q, k, v, o, post norm, gate, up, down), norm, head; bf16
  EXPECT_EQ(p.bytes(), (96 * 16 + 2 * (16 + 16 * 16 + 2 * 8 * 16 + 16 * 16 + 16 + 3 * 32 * 16) + 16 + 96 * 16) * 2u);
}

TEST(HfExportPlan, ConfigStatesTheModelAsTransformersFiveWritesIt) {
  const ExportPlan p = plan_hf_export(shipped_hf_families(), llama_facts(), llama_input(), DType::BFloat16, 5ull << 30, "in");
  const auto& c = p.config;
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["head_dim"], 4);
  EXPECT_EQ(c["intermediate_size"], 32);
  EXPECT_EQ(c["vocab_size"], 96);  // every row the source holds
  EXPECT_EQ(c["tie_word_embeddings"], false);
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["dtype"], "bfloat16");
  EXPECT_EQ(c["rope_parameters"]["rope_type"], "default");
  EXPECT_DOUBLE_EQ(c["rope_parameters"]["rope_theta"].get<double>(), 10000.0);
  auto f = llama_facts();
  f["rope_llama3_factor"] = 8.0;
  const auto scaled = hf_config(select_family(shipped_hf_families(), with_derived_facts(f, {}), "in"), f, 96, DType::Float32);
  EXPECT_EQ(scaled["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(scaled["rope_parameters"]["original_max_position_embeddings"], 8192);
}

TEST(HfExportPlan, TheVocabularyIsCutToTheSourcesRows) {
  ExportInput in = llama_input();
  in.vocab = 65;  // a DeepSpeed source's rows (the Megatron-Core view padded them to 96)
  const ExportPlan p = plan_hf_export(shipped_hf_families(), llama_facts(), in, DType::Float32, 5ull << 30, "in");
  EXPECT_EQ(tensor(p, "model.embed_tokens.weight").shape, (std::vector<int64_t>{65, 16}));
  EXPECT_EQ(tensor(p, "lm_head.weight").shape, (std::vector<int64_t>{65, 16}));
  EXPECT_EQ(p.config["vocab_size"], 65);
}

TEST(HfExportPlan, TheFamilyFollowsTheBiasesAndNorms) {
  auto f = llama_facts();
  ExportInput in = llama_input();  // QKV biases only (--add-qkv-bias --disable-bias-linear): Qwen2
  for (int l = 0; l < 2; ++l)
    in.names.push_back("decoder.layers." + std::to_string(l) + ".self_attention.linear_qkv.bias"), in.shapes.push_back({32});
  ExportPlan p = plan_hf_export(shipped_hf_families(), f, in, DType::Float32, 5ull << 30, "in");
  EXPECT_EQ(p.family, "qwen2");
  EXPECT_EQ(tensor(p, "model.layers.0.self_attn.k_proj.bias").shape, std::vector<int64_t>{8});
  EXPECT_EQ(tensor(p, "model.layers.0.self_attn.v_proj.bias").row0, 24);

  f = llama_facts();
  f["qk_norm"] = true;  // --qk-layernorm: Qwen3
  in = llama_input();
  for (int l = 0; l < 2; ++l)
    for (const char* n : {"q_layernorm", "k_layernorm"})
      in.names.push_back("decoder.layers." + std::to_string(l) + ".self_attention." + n + ".weight"), in.shapes.push_back({4});
  p = plan_hf_export(shipped_hf_families(), f, in, DType::Float32, 5ull << 30, "in");
  EXPECT_EQ(p.family, "qwen3");
  EXPECT_EQ(tensor(p, "model.layers.1.self_attn.k_norm.weight").shape, std::vector<int64_t>{4});

  f = llama_facts();
  f["experts"] = 8;  // no MoE map ships yet: refused naming the maps looked at
  try {
    plan_hf_export(shipped_hf_families(), f, llama_input(), DType::Float32, 5ull << 30, "in");
    ADD_FAILURE() << "an MoE model was given a dense family";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no Hugging Face family map fits"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama (shipped:llama.json)"), std::string::npos) << e.what();
  }
}

// Nothing is dropped: a parameter no rule names is an error naming it, never a smaller model.
TEST(HfExportPlan, AParameterWithoutARuleIsRefused) {
  ExportInput in = llama_input();
  in.names.push_back("decoder.layers.0.self_attention.extra.weight"), in.shapes.push_back({4});
  try {
    plan_hf_export(shipped_hf_families(), llama_facts(), in, DType::Float32, 5ull << 30, "ckpt");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt: parameter decoder.layers.0.self_attention.extra.weight has no rule"),
              std::string::npos) << e.what();
  }
  in = llama_input();
  in.names.pop_back(), in.shapes.pop_back();  // untied, but no output layer
  EXPECT_THROW(plan_hf_export(shipped_hf_families(), llama_facts(), in, DType::Float32, 5ull << 30, "in"), Error);
  in = llama_input();
  in.shapes[2] = {30, 16};  // linear_qkv rows disagree with the heads
  EXPECT_THROW(plan_hf_export(shipped_hf_families(), llama_facts(), in, DType::Float32, 5ull << 30, "in"), Error);
}

TEST(HfExportPlan, ShardsAreNamedAsSavePretrainedNamesThem) {
  const ExportPlan p = plan_hf_export(shipped_hf_families(), llama_facts(), llama_input(), DType::Float32, 4096, "in");
  ASSERT_GT(p.files.size(), 1u);
  EXPECT_EQ(p.files.front(), "model-00001-of-" + std::string(5 - std::to_string(p.files.size()).size(), '0') +
                                 std::to_string(p.files.size()) + ".safetensors");
  size_t n = 0;
  for (const auto& s : p.shards) n += s.size();
  EXPECT_EQ(n, p.tensors.size());
  const auto j = p.to_json();
  EXPECT_EQ(j["tensors"], 21);
  EXPECT_EQ(j["files"].size(), p.files.size());
}

namespace {

// An all-MoE Megatron-Core model (every layer: router and 3 SequentialMLP experts of ffn 24, no shared
// expert), the names ucp-union gives a torch_dist MoE save.
ExportInput moe_input(bool qk_norm) {
  ExportInput in = llama_input();
  ExportInput out;
  for (size_t i = 0; i < in.names.size(); ++i)
    if (in.names[i].find(".mlp.linear_fc") == std::string::npos) out.names.push_back(in.names[i]), out.shapes.push_back(in.shapes[i]);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "decoder.layers." + std::to_string(l) + ".";
    out.names.push_back(p + "mlp.linear_fc1.layer_norm_weight"), out.shapes.push_back({16});
    out.names.push_back(p + "mlp.router.weight"), out.shapes.push_back({3, 16});
    for (int e = 2; e >= 0; --e) {  // any order in: experts ascending out
      out.names.push_back(p + "mlp.experts.experts." + std::to_string(e) + ".linear_fc1.weight"), out.shapes.push_back({48, 16});
      out.names.push_back(p + "mlp.experts.experts." + std::to_string(e) + ".linear_fc2.weight"), out.shapes.push_back({16, 24});
    }
    if (qk_norm)
      for (const char* n : {"q_layernorm", "k_layernorm"})
        out.names.push_back(p + "self_attention." + n + ".weight"), out.shapes.push_back({4});
  }
  return out;
}

nlohmann::json moe_facts(bool qk_norm, bool pre_softmax) {
  auto f = llama_facts();
  f["experts"] = 3, f["moe_ffn"] = 24, f["moe_topk"] = 2, f["qk_norm"] = qk_norm;
  f["moe_pre_softmax"] = pre_softmax, f["moe_aux_loss"] = 0.01;
  return f;
}

}  // namespace

TEST(HfExportPlan, MixtralExpertsAreWrittenPerExpertAsSavePretrainedWritesThem) {
  const ExportPlan p = plan_hf_export(shipped_hf_families(), moe_facts(false, false), moe_input(false), DType::Float32, 5ull << 30, "in");
  EXPECT_EQ(p.family, "mixtral");
  // embed, per layer (input norm, q, k, v, o, post norm, gate, 3 x (w1, w3, w2)), norm, head
  ASSERT_EQ(p.tensors.size(), 1u + 2 * (6 + 1 + 9) + 2);
  EXPECT_EQ(tensor(p, "model.layers.1.block_sparse_moe.gate.weight").shape, (std::vector<int64_t>{3, 16}));
  const Piece& w1 = tensor(p, "model.layers.1.block_sparse_moe.experts.2.w1.weight");
  const Piece& w3 = tensor(p, "model.layers.1.block_sparse_moe.experts.2.w3.weight");
  EXPECT_EQ(w1.row0, 0);  // SwiGLU [W; V]: W is the gate (w1), V the up projection (w3)
  EXPECT_EQ(w3.row0, 24);
  EXPECT_EQ(w3.shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(tensor(p, "model.layers.0.block_sparse_moe.experts.0.w2.weight").shape, (std::vector<int64_t>{16, 24}));
  // Within a layer's rule, experts ascending whatever the input's order.
  std::vector<std::string> w2;
  for (const auto& t : p.tensors)
    if (t.name.rfind("model.layers.0.block_sparse_moe.experts.", 0) == 0 && t.name.find(".w2.") != std::string::npos) w2.push_back(t.name);
  EXPECT_EQ(w2, (std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.0.w2.weight", "model.layers.0.block_sparse_moe.experts.1.w2.weight",
                                          "model.layers.0.block_sparse_moe.experts.2.w2.weight"}));
  EXPECT_EQ(p.config["model_type"], "mixtral");
  EXPECT_EQ(p.config["num_local_experts"], 3);
  EXPECT_EQ(p.config["num_experts_per_tok"], 2);
  EXPECT_EQ(p.config["intermediate_size"], 24);  // Mixtral's intermediate_size is the experts'
  EXPECT_EQ(p.config["router_aux_loss_coef"], 0.01);
}

TEST(HfExportPlan, Qwen3MoeStatesTheRoutersNormalisationAndBothExpertCountKeys) {
  const ExportPlan p = plan_hf_export(shipped_hf_families(), moe_facts(true, true), moe_input(true), DType::BFloat16, 5ull << 30, "in");
  EXPECT_EQ(p.family, "qwen3_moe");
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.gate.weight").shape, (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.experts.1.up_proj.weight").row0, 24);
  EXPECT_EQ(tensor(p, "model.layers.1.self_attn.k_norm.weight").shape, std::vector<int64_t>{4});
  EXPECT_EQ(p.config["num_experts"], 3);  // transformers 4 reads num_experts, 5 num_local_experts
  EXPECT_EQ(p.config["num_local_experts"], 3);
  EXPECT_EQ(p.config["moe_intermediate_size"], 24);
  EXPECT_EQ(p.config["intermediate_size"], 32);
  EXPECT_EQ(p.config["norm_topk_prob"], false);  // --moe-router-pre-softmax: no renormalisation
  EXPECT_EQ(p.config["decoder_sparse_step"], 1);
}

TEST(HfExportPlan, MoeMathNoFamilyComputesIsRefused) {
  auto facts = moe_facts(false, true);  // Mixtral renormalises its top k: a pre-softmax router fits no map
  try {
    plan_hf_export(shipped_hf_families(), facts, moe_input(false), DType::Float32, 5ull << 30, "in");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no Hugging Face family map fits"), std::string::npos) << e.what();
  }
  facts = moe_facts(false, false);
  facts["shared_ffn"] = 32;
  EXPECT_THROW(plan_hf_export(shipped_hf_families(), facts, moe_input(false), DType::Float32, 5ull << 30, "in"), Error);
}

// --hf-experts fused: one tensor per layer and projection, the experts stacked whole in order (gate_up_proj[e]
// = [gate; up], SwiGLU's fc1 as it is), the router under transformers 5's in-memory name.
TEST(HfExportPlan, FusedExpertsStackEachExpertWhole) {
  const ExportPlan p =
      plan_hf_export(shipped_hf_families(), moe_facts(false, false), moe_input(false), DType::Float32, 5ull << 30, "in", true);
  ASSERT_EQ(p.tensors.size(), 1u + 2 * (6 + 1 + 2) + 2);
  const Piece& gate_up = tensor(p, "model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(gate_up.shape, (std::vector<int64_t>{3, 48, 16}));
  EXPECT_EQ(gate_up.split, Split::None);
  ASSERT_EQ(gate_up.stack.size(), 3u);
  const ExportInput in = moe_input(false);
  for (size_t e = 0; e < 3; ++e)
    EXPECT_EQ(in.names[gate_up.stack[e]], "decoder.layers.1.mlp.experts.experts." + std::to_string(e) + ".linear_fc1.weight");
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.experts.down_proj").shape, (std::vector<int64_t>{3, 16, 24}));
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.gate.weight").shape, (std::vector<int64_t>{3, 16}));
  EXPECT_EQ(p.bytes(), plan_hf_export(shipped_hf_families(), moe_facts(false, false), in, DType::Float32, 5ull << 30, "in").bytes());
  // A missing expert breaks the stack: named, never a shorter tensor.
  ExportInput gap = in;
  for (size_t i = 0; i < gap.names.size(); ++i)
    if (gap.names[i] == "decoder.layers.0.mlp.experts.experts.1.linear_fc2.weight") gap.names.erase(gap.names.begin() + i), gap.shapes.erase(gap.shapes.begin() + i);
  EXPECT_THROW(plan_hf_export(shipped_hf_families(), moe_facts(false, false), gap, DType::Float32, 5ull << 30, "in", true), Error);
}

namespace {

// Qwen2-MoE's shape in Megatron-Core: layer 0 dense (--moe-layer-freq [0, 1]), layer 1 MoE with a gated shared
// expert of ffn 40, biases on QKV only.
ExportInput qwen2_moe_input() {
  ExportInput in = moe_input(false);
  ExportInput out;
  for (size_t i = 0; i < in.names.size(); ++i)
    if (in.names[i].rfind("decoder.layers.0.mlp.", 0) != 0 || in.names[i].find("layer_norm_weight") != std::string::npos)
      out.names.push_back(in.names[i]), out.shapes.push_back(in.shapes[i]);
  out.names.push_back("decoder.layers.0.mlp.linear_fc1.weight"), out.shapes.push_back({64, 16});
  out.names.push_back("decoder.layers.0.mlp.linear_fc2.weight"), out.shapes.push_back({16, 32});
  out.names.push_back("decoder.layers.1.mlp.shared_experts.linear_fc1.weight"), out.shapes.push_back({80, 16});
  out.names.push_back("decoder.layers.1.mlp.shared_experts.linear_fc2.weight"), out.shapes.push_back({16, 40});
  out.names.push_back("decoder.layers.1.mlp.shared_experts.gate_weight"), out.shapes.push_back({1, 16});
  for (int l = 0; l < 2; ++l) out.names.push_back("decoder.layers." + std::to_string(l) + ".self_attention.linear_qkv.bias"), out.shapes.push_back({32});
  return out;
}

nlohmann::json qwen2_moe_facts() {
  auto f = moe_facts(false, true);
  f["shared_ffn"] = 40, f["shared_gate"] = true, f["dense_layers"] = {0};
  return f;
}

}  // namespace

// Qwen2-MoE: the shared expert (gate/up/down_proj, its sigmoid gate), the dense layer's MLP under the dense
// names, and mlp_only_layers in config.json for the layers --moe-layer-freq makes dense.
TEST(HfExportPlan, Qwen2MoeWritesTheSharedExpertAndTheDenseLayers) {
  const ExportPlan p = plan_hf_export(shipped_hf_families(), qwen2_moe_facts(), qwen2_moe_input(), DType::BFloat16, 5ull << 30, "in");
  EXPECT_EQ(p.family, "qwen2_moe");
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.gate_proj.weight").shape, (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.up_proj.weight").row0, 32);
  EXPECT_EQ(tensor(p, "model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(tensor(p, "model.layers.1.mlp.shared_expert.up_proj.weight").row0, 40);
  EXPECT_EQ(tensor(p, "model.layers.1.mlp.shared_expert.up_proj.weight").shape, (std::vector<int64_t>{40, 16}));
  EXPECT_EQ(tensor(p, "model.layers.1.mlp.shared_expert.down_proj.weight").shape, (std::vector<int64_t>{16, 40}));
  EXPECT_EQ(tensor(p, "model.layers.1.mlp.shared_expert_gate.weight").shape, (std::vector<int64_t>{1, 16}));
  EXPECT_EQ(tensor(p, "model.layers.1.mlp.experts.2.gate_proj.weight").shape, (std::vector<int64_t>{24, 16}));
  EXPECT_EQ(tensor(p, "model.layers.0.self_attn.k_proj.bias").shape, (std::vector<int64_t>{8}));
  EXPECT_THROW(tensor(p, "model.layers.0.mlp.gate.weight"), Error);
  EXPECT_EQ(p.config["model_type"], "qwen2_moe");
  EXPECT_EQ(p.config["mlp_only_layers"], nlohmann::json::array({0}));
  EXPECT_EQ(p.config["decoder_sparse_step"], 1);
  EXPECT_EQ(p.config["shared_expert_intermediate_size"], 40);
  EXPECT_EQ(p.config["intermediate_size"], 32);  // the dense layers'
  EXPECT_EQ(p.config["moe_intermediate_size"], 24);
  EXPECT_EQ(p.config["qkv_bias"], true);
  EXPECT_EQ(p.config["norm_topk_prob"], false);
}

// Names that contradict the args' layer pattern are refused, naming the parameter; a pattern with dense layers
// fits no family without dense-layer rules (Mixtral).
TEST(HfExportPlan, ALayerPatternTheNamesContradictIsRefused) {
  auto facts = qwen2_moe_facts();
  facts["dense_layers"] = nlohmann::json::array();  // the args say every layer is MoE
  try {
    plan_hf_export(shipped_hf_families(), facts, qwen2_moe_input(), DType::BFloat16, 5ull << 30, "in");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder.layers.0.mlp.linear_fc1.weight belongs to a dense layer"), std::string::npos) << e.what();
  }
  facts = moe_facts(false, false);
  facts["dense_layers"] = {1};
  try {
    plan_hf_export(shipped_hf_families(), facts, moe_input(false), DType::Float32, 5ull << 30, "in");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no Hugging Face family map fits"), std::string::npos) << e.what();
  }
}

}  // namespace hf_export_plan_test
