// lib/to_universal/hf_joined_stream: every parameter of an import made on demand equals, byte for byte, the whole
// join (hf_fresh_state "fp32", hf_joined_value): a Llama with 4 heads in 2 query groups (the QKV rows regrouped
// across groups), SwiGLU's [gate; up], 1-d norms, its bf16 rows upcast; read in windows of odd sizes and as boxes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/hf/folder.h"
#include "io/generated_view.h"
#include "io/safetensors_file.h"
#include "support/files.h"
#include "to_universal/from_hf.h"
#include "to_universal/hf_joined_stream.h"

namespace ucpkit::to_universal {
namespace hf_joined_stream_test {
namespace {

namespace fs = std::filesystem;

// Distinct bf16 values (element i of tensor `base`: base * 64 + i % 64, exact in bfloat16).
SafetensorsTensor bf16(std::vector<int64_t> shape, int base) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::string bytes(static_cast<size_t>(n) * 2, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(base * 64 + i % 64);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    const uint16_t h = static_cast<uint16_t>(b >> 16);
    std::memcpy(bytes.data() + i * 2, &h, 2);
  }
  return {"BF16", shape, bytes};
}

fs::path llama_gqa(const std::string& dir) {
  // Each tensor's values start at a base of its own (its place in this list).
  const std::string layer = "model.layers.0.";
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {16, 8}}, {layer + "input_layernorm.weight", {8}},
      {layer + "self_attn.q_proj.weight", {8, 8}}, {layer + "self_attn.k_proj.weight", {4, 8}},
      {layer + "self_attn.v_proj.weight", {4, 8}}, {layer + "self_attn.o_proj.weight", {8, 8}},
      {layer + "post_attention_layernorm.weight", {8}}, {layer + "mlp.gate_proj.weight", {16, 8}},
      {layer + "mlp.up_proj.weight", {16, 8}}, {layer + "mlp.down_proj.weight", {8, 16}},
      {"model.norm.weight", {8}}, {"lm_head.weight", {16, 8}}};
  std::map<std::string, SafetensorsTensor> t;
  for (size_t k = 0; k < shapes.size(); ++k) t[shapes[k].first] = bf16(shapes[k].second, static_cast<int>(k) + 1);
  const fs::path d = fs::path(dir) / "hf";
  fs::create_directories(d);
  std::ofstream(d / "model.safetensors", std::ios::binary) << safetensors_bytes(t);
  const nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}}, {"hidden_size", 8}, {"intermediate_size", 16},
                                 {"num_hidden_layers", 1}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                                 {"head_dim", 2}, {"max_position_embeddings", 8}, {"vocab_size", 16},
                                 {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", false}, {"dtype", "bfloat16"}};
  std::ofstream(d / "config.json") << config.dump();
  return d;
}

// The bytes of a generated tensor, asked for in windows of `window` elements.
std::vector<uint8_t> generate_all(const Tensor& t, size_t window) {
  std::vector<uint8_t> out(t.nbytes());
  const size_t es = dtype_size(t.dtype());
  for (size_t at = 0; at < out.size(); at += window * es)
    t.storage()->generate(at, {out.data() + at, std::min(window * es, out.size() - at)});
  return out;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.contiguous(true);
  const auto b = c.contiguous_bytes();
  return {b.begin(), b.end()};
}

}  // namespace

TEST(HfJoinedStream, EveryParameterEqualsTheWholeJoin) {
  ucpkit::testing::TempDir dir("hf_joined_stream");
  const formats::hf::Folder folder(llama_gqa(dir.path()).string());
  const formats::hf::ImportPlan plan = hf_import_plan(folder);
  ASSERT_GE(plan.params.size(), 7u);
  bool qkv = false;
  for (size_t k = 0; k < plan.params.size(); ++k) {
    const auto& p = plan.params[k];
    qkv = qkv || p.merge == formats::hf::Split::Qkv;
    const Tensor whole = hf_fresh_state(folder, plan, k, "fp32");
    const Tensor streamed = hf_joined_stream(folder, plan, p);
    ASSERT_TRUE(streamed.storage()->is_generated()) << p.name;
    EXPECT_EQ(streamed.shape(), whole.shape()) << p.name;
    for (size_t window : {size_t{1}, size_t{3}, size_t{7}, size_t{1} << 20})
      EXPECT_EQ(generate_all(streamed, window), bytes_of(whole)) << p.name << ", windows of " << window;
    // Its boxes (a TP piece of rows or of columns) and its bf16 copy, still generated.
    if (whole.dim() == 2) {
      const int64_t r = whole.shape()[0], c = whole.shape()[1];
      const Tensor rows = generated_box(streamed, {r / 2, 0}, {r - r / 2, c});
      EXPECT_EQ(generate_all(rows, 5), bytes_of(whole.narrow(0, r / 2, r - r / 2))) << p.name;
      const Tensor cols = generated_box(streamed, {1, c / 2}, {r - 1, c - c / 2});
      EXPECT_EQ(generate_all(cols, 3), bytes_of(whole.narrow(0, 1, r - 1).narrow(1, c / 2, c - c / 2))) << p.name;
    }
    EXPECT_EQ(generate_all(generated_cast(streamed, DType::BFloat16), 5), bytes_of(whole.to(DType::BFloat16))) << p.name;
  }
  EXPECT_TRUE(qkv) << "the plan has a QKV to regroup";
  // Zeros stay zeros that say so, through boxes and casts.
  const Tensor zeros = hf_fresh_state(folder, plan, 0, "exp_avg");
  EXPECT_TRUE(generated_box(zeros, {0, 0}, {1, 8}).storage()->is_zero());
  EXPECT_TRUE(generated_cast(zeros, DType::BFloat16).storage()->is_zero());
}

}  // namespace hf_joined_stream_test
}  // namespace ucpkit::to_universal
