// lib/to_universal/from_hf (registered as the union of Hugging Face folders, reached through run_union and
// count_union): a tiny Llama written here with a distinct value in every element, converted in-process. The
// expected Megatron-Core tensors are assembled by hand from the Hugging Face ones (QKV per query group,
// [gate; up] for SwiGLU's fc1), with a fresh run's optimizer state (zeros, step 0).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/files.h"
#include "to_universal/convert.h"
#include "to_universal/union_executor.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace from_hf_test {
namespace {

using ucpkit::testing::error_of;

using ucpkit::testing::TempDir;

void put(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// Element i of tensor number `base` is base * 16 + i % 16 (small integers: exact in bfloat16).
float value(int base, int64_t i) { return static_cast<float>(base * 16 + i % 16); }

SafetensorsTensor bf16(std::vector<int64_t> shape, int base) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::string bytes(static_cast<size_t>(n) * 2, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float f = value(base, i);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint16_t h = static_cast<uint16_t>(b >> 16);  // exact: the low half is zero
    std::memcpy(bytes.data() + i * 2, &h, 2);
  }
  return {"BF16", shape, bytes};
}

std::vector<float> values(int base, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = value(base, i);
  return v;
}

// A Llama with hidden 8, 2 heads of 4 in 1 KV group, intermediate 16, 1 layer, vocabulary 16, untied.
void write_llama(const fs::path& d) {
  fs::create_directories(d);
  const std::map<std::string, SafetensorsTensor> t = {{"model.embed_tokens.weight", bf16({16, 8}, 1)},
                                                      {"model.layers.0.input_layernorm.weight", bf16({8}, 2)},
                                                      {"model.layers.0.self_attn.q_proj.weight", bf16({8, 8}, 3)},
                                                      {"model.layers.0.self_attn.k_proj.weight", bf16({4, 8}, 4)},
                                                      {"model.layers.0.self_attn.v_proj.weight", bf16({4, 8}, 5)},
                                                      {"model.layers.0.self_attn.o_proj.weight", bf16({8, 8}, 6)},
                                                      {"model.layers.0.post_attention_layernorm.weight", bf16({8}, 7)},
                                                      {"model.layers.0.mlp.gate_proj.weight", bf16({16, 8}, 8)},
                                                      {"model.layers.0.mlp.up_proj.weight", bf16({16, 8}, 9)},
                                                      {"model.layers.0.mlp.down_proj.weight", bf16({8, 16}, 10)},
                                                      {"model.norm.weight", bf16({8}, 11)},
                                                      {"lm_head.weight", bf16({16, 8}, 12)}};
  put(d / "model.safetensors", safetensors_bytes(t));
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                                 {"hidden_size", 8},
                                 {"intermediate_size", 16},
                                 {"num_hidden_layers", 1},
                                 {"num_attention_heads", 2},
                                 {"num_key_value_heads", 1},
                                 {"head_dim", 4},
                                 {"max_position_embeddings", 8},
                                 {"vocab_size", 16},
                                 {"rms_norm_eps", 1e-5},
                                 {"tie_word_embeddings", false},
                                 {"dtype", "bfloat16"}};
  put(d / "config.json", config.dump());
}

Tensor state(const fs::path& out, const std::string& param, const std::string& name) {
  auto root = load_torch((out / "zero" / param / (name + ".pt")).string());
  return root->is(pickle::Kind::Dict) ? root->at("param")->as_tensor() : root->as_tensor();
}

std::vector<float> cat(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

ConvertOptions quiet(std::vector<std::string>* warnings = nullptr) {
  ConvertOptions o;
  o.sync = false;
  o.threads = 2;
  if (warnings) o.reporter.warn = [warnings](const std::string& w) { warnings->push_back(w); };
  return o;
}

TEST(HfUnion, LlamaWeightsBecomeMegatronCoreParametersWithAFreshOptimizer) {
  TempDir d;
  write_llama(d.path() / "hf");
  std::vector<std::string> warnings;
  const fs::path out = d.path() / "u";
  const RunSummary s = run_union((d.path() / "hf").string(), out.string(), quiet(&warnings));
  EXPECT_EQ(s.params, 9u);  // 12 tensors, q/k/v joined into one qkv and gate/up into one fc1
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("Hugging Face family"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("9 Megatron-Core parameters"), std::string::npos) << warnings[0];

  // name -> the Hugging Face tensors it is made of, in Megatron-Core's layout.
  const std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> expect = {
      {"embedding.word_embeddings.weight", {{16, 8}, values(1, 128)}},
      {"decoder.layers.0.self_attention.linear_qkv.layer_norm_weight", {{8}, values(2, 8)}},
      // One query group: its 2 query heads, then its key and value heads.
      {"decoder.layers.0.self_attention.linear_qkv.weight",
       {{16, 8}, cat({values(3, 64), values(4, 32), values(5, 32)})}},
      {"decoder.layers.0.self_attention.linear_proj.weight", {{8, 8}, values(6, 64)}},
      {"decoder.layers.0.mlp.linear_fc1.layer_norm_weight", {{8}, values(7, 8)}},
      {"decoder.layers.0.mlp.linear_fc1.weight", {{32, 8}, cat({values(8, 128), values(9, 128)})}},
      {"decoder.layers.0.mlp.linear_fc2.weight", {{8, 16}, values(10, 128)}},
      {"decoder.final_layernorm.weight", {{8}, values(11, 8)}},
      {"output_layer.weight", {{16, 8}, values(12, 128)}}};
  for (const auto& [name, want] : expect) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(out / "zero" / name / "fp32.pt"));
    const Tensor fp32 = state(out, name, "fp32");
    EXPECT_EQ(fp32.dtype(), DType::Float32);
    EXPECT_EQ(fp32.shape(), want.first);
    EXPECT_EQ(fp32.contiguous().to_vector<float>(), want.second);
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const Tensor m = state(out, name, moment);
      EXPECT_EQ(m.shape(), want.first);
      EXPECT_EQ(m.contiguous().to_vector<float>(), std::vector<float>(want.second.size(), 0.0f)) << moment;
    }
    EXPECT_EQ(load_torch((out / "zero" / name / "step.pt").string())->as_int(), 0);
  }
  for (const char* f :
       {"manifest.json", "zero/optimizer_state.pt", "megatron_core/common_state.pt", "megatron_core/objects.pt"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  std::ifstream in(out / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  EXPECT_EQ(manifest["source"]["format"], "hf") << manifest["source"].dump();
  EXPECT_EQ(manifest["source"]["hf"]["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(manifest["source"]["hf"]["vocab_size"], 16);
  // A fresh AdamW's groups: the matrices with weight decay, the norms without.
  const auto opt = load_torch((out / "zero" / "optimizer_state.pt").string());
  EXPECT_EQ(opt->at("param_groups")->items.size(), 2u);
}

TEST(HfUnion, DryRunCountsFourFilesPerParameterAndTheSourceBytes) {
  TempDir d;
  write_llama(d.path() / "hf");
  const UnionCounts c = count_union((d.path() / "hf").string(), quiet());
  EXPECT_EQ(c.params, 9u);
  EXPECT_EQ(c.atomic_files, 36u);
  // Every Hugging Face element once, in bfloat16: 16*8*2 + 8*3 + 8*8*2 + 4*8*2 + 16*8*2 + 8*16.
  EXPECT_EQ(c.bytes, 2u * (256 + 24 + 128 + 64 + 256 + 128));
  EXPECT_EQ(c.input_kind, "hf");
}

TEST(HfUnion, PatternsAreRefused) {
  TempDir d;
  write_llama(d.path() / "hf");
  auto o = quiet();
  o.patterns_file = "x.json";
  const auto what = error_of([&] { run_union((d.path() / "hf").string(), (d.path() / "u").string(), o); });
  EXPECT_NE(what.find("no TP slices to join"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(d.path() / "u"));
}

TEST(HfUnion, AnIntegerWeightIsRefusedAndNothingIsWritten) {
  TempDir d;
  write_llama(d.path() / "hf");
  auto t = parse_safetensors(ucpkit::testing::file_bytes((d.path() / "hf" / "model.safetensors").string()), "m");
  t["model.norm.weight"] = {"I16", {8}, std::string(16, '\1')};
  put(d.path() / "hf" / "model.safetensors", safetensors_bytes(t));
  const auto what = error_of([&] { run_union((d.path() / "hf").string(), (d.path() / "u").string(), quiet()); });
  EXPECT_NE(what.find("model.norm.weight"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(d.path() / "u"));
}

}  // namespace
}  // namespace from_hf_test
}  // namespace ucpkit::to_universal
