// The Hugging Face export plan, family maps and config.json (formats/hf), without I/O.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "formats/hf/config.h"
#include "formats/hf/export_plan.h"
#include "formats/hf/family_map.h"

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
