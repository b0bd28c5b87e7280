// ucp-load --format hf through the tool (reshard/hf_output.cpp, docs/hf.md), the way users run it: from
// another folder, relative paths, options left out. Source: the committed core_v0.16.1 Megatron-Core
// save (tests/formats/megatron_core/data/llama_gqa_tp2_dp2_v016, TP 2 x DP 2, 4 heads in 2 query
// groups); its truth is what Megatron's own reader returned (`fully_reshardable.truth`, bf16, layers
// stacked). Checked here against that truth with the test's own split; transformers and Megatron-Core
// judge the same output in tests/frameworks/hf_export_test.sh.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/safetensors_file.h"
#include "support/paths.h"
#include "support/process.h"

namespace hf_output_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

const std::string kSave = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/megatron_core/data/llama_gqa_tp2_dp2_v016";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Rows [r0, r0 + n) of layer `layer` of a [layers, rows, cols] truth tensor (2-byte elements).
std::string rows_of(const SafetensorsTensor& t, int layer, int64_t r0, int64_t n) {
  const int64_t rows = t.shape[1], cols = t.shape.size() > 2 ? t.shape[2] : 1;
  const size_t row = static_cast<size_t>(cols) * 2;
  return t.bytes.substr((static_cast<size_t>(layer * rows + r0)) * row, static_cast<size_t>(n) * row);
}

struct Folders {
  std::string root, work;
};

Folders fresh(const std::string& name) {
  Folders r{ucpkit::testing::scratch_dir("hf_output_" + name), ""};
  r.work = r.root + "/work";
  fs::create_directories(r.work);
  fs::create_directory_symlink(kSave, r.root + "/save");
  return r;
}

}  // namespace

TEST(HfOutput, ATorchDistSaveBecomesTheHuggingFaceTensorsOfMegatronsOwn) {
  const Folders r = fresh("llama");
  const auto res = ucpkit::testing::run_split_in(
      r.work, kBin + "/ucp-load --input ../save/fully_reshardable --format hf --output hf --json", r.root);
  ASSERT_EQ(res.rc, 0) << res.err;
  const auto summary = nlohmann::json::parse(res.out);
  EXPECT_EQ(summary["target"]["family"], "llama");
  EXPECT_EQ(summary["from_source"]["dtype"], "bf16");  // the source's, said
  EXPECT_NE(res.err.find("weights only"), std::string::npos) << res.err;
  const auto config = nlohmann::json::parse(slurp(r.work + "/hf/config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["vocab_size"], 96);
  EXPECT_FALSE(fs::exists(r.work + "/hf/model.safetensors.index.json"));  // one file: no index, as save_pretrained

  const auto ours = parse_safetensors(slurp(r.work + "/hf/model.safetensors"), "model.safetensors");
  const auto truth = parse_safetensors(slurp(kSave + "/fully_reshardable.truth/tensors.safetensors"), "truth");
  ASSERT_EQ(ours.size(), 21u);
  const auto& qkv = truth.at("decoder.layers.self_attention.linear_qkv.weight");
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    // Per query group g (16 rows): 2 query heads (8 rows), its key head (4), its value head (4).
    EXPECT_EQ(ours.at(p + "self_attn.q_proj.weight").bytes, rows_of(qkv, layer, 0, 8) + rows_of(qkv, layer, 16, 8));
    EXPECT_EQ(ours.at(p + "self_attn.k_proj.weight").bytes, rows_of(qkv, layer, 8, 4) + rows_of(qkv, layer, 24, 4));
    EXPECT_EQ(ours.at(p + "self_attn.v_proj.weight").bytes, rows_of(qkv, layer, 12, 4) + rows_of(qkv, layer, 28, 4));
    const auto& fc1 = truth.at("decoder.layers.mlp.linear_fc1.weight");
    EXPECT_EQ(ours.at(p + "mlp.gate_proj.weight").bytes, rows_of(fc1, layer, 0, 32));
    EXPECT_EQ(ours.at(p + "mlp.up_proj.weight").bytes, rows_of(fc1, layer, 32, 32));
    EXPECT_EQ(ours.at(p + "mlp.down_proj.weight").bytes,
              rows_of(truth.at("decoder.layers.mlp.linear_fc2.weight"), layer, 0, 16));
    EXPECT_EQ(ours.at(p + "input_layernorm.weight").bytes,
              truth.at("decoder.layers.self_attention.linear_qkv.layer_norm_weight").bytes.substr(layer * 32, 32));
    EXPECT_EQ(ours.at(p + "self_attn.q_proj.weight").dtype, "BF16");
  }
  EXPECT_EQ(ours.at("model.embed_tokens.weight").bytes, truth.at("embedding.word_embeddings.weight").bytes);
  EXPECT_EQ(ours.at("lm_head.weight").bytes, truth.at("output_layer.weight").bytes);
  EXPECT_EQ(ours.at("model.norm.weight").bytes, truth.at("decoder.final_layernorm.weight").bytes);
}

// The plan of a universal folder: the family, the tensors in their files, config.json; nothing written.
TEST(HfOutput, PlanAndDtype) {
  const Folders r = fresh("plan");
  ASSERT_EQ(ucpkit::testing::run_split_in(r.work, kBin + "/ucp-union -q --input ../save/dp_reshardable --output u", r.root).rc, 0);
  auto res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load --input u --format hf --output hf --plan --shard-size 2K", r.root);
  ASSERT_EQ(res.rc, 0) << res.err;
  const auto plan = nlohmann::json::parse(res.out);
  EXPECT_EQ(plan["family"], "llama");
  EXPECT_EQ(plan["tensors"], 21);
  EXPECT_GT(plan["files"].size(), 1u);
  EXPECT_FALSE(fs::exists(r.work + "/hf"));
  res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load -q --input u --format hf --output hf --dtype fp32 --shard-size 2K --audit a.json", r.root);
  ASSERT_EQ(res.rc, 0) << res.err;
  const auto audit = nlohmann::json::parse(slurp(r.work + "/a.json"));
  EXPECT_EQ(audit["totals"]["tensors"], 21);
  EXPECT_EQ(audit["dtype_changes"]["bfloat16 -> float32"], 21);  // the source's bf16 model written fp32
  EXPECT_EQ(audit["tensors"].size(), 21u);
  const auto index = nlohmann::json::parse(slurp(r.work + "/hf/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), 21u);
  EXPECT_EQ(nlohmann::json::parse(slurp(r.work + "/hf/config.json"))["dtype"], "float32");
}

// What an HF folder cannot hold or be made from: one line, the right exit code, nothing left behind.
TEST(HfOutput, RefusalsLeaveNothing) {
  const Folders r = fresh("refusals");
  // Layout options mean nothing for one set of weights: a usage error naming the formats that take them.
  auto res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load --input ../save/fully_reshardable --format hf --tp 2 --output hf", r.root);
  EXPECT_EQ(res.rc, 2) << res.err;
  res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load --input ../save/fully_reshardable --format dcp --audit a.json --output hf", r.root);
  EXPECT_EQ(res.rc, 2) << res.err;  // only --format hf writes an audit
  EXPECT_NE(res.err.find("--audit applies to --format hf"), std::string::npos) << res.err;
  EXPECT_FALSE(fs::exists(r.work + "/hf"));
  // A DCP checkpoint holds no model args: refused naming the input and what is missing.
  const std::string dcp = std::string(UCPKIT_SOURCE_DIR) + "/tests/formats/dcp/data/plain_w2";
  res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load --input " + dcp + " --format hf --output hf", r.root);
  EXPECT_EQ(res.rc, 1) << res.err;
  EXPECT_NE(res.err.find("common state"), std::string::npos) << res.err;
  EXPECT_NE(res.err.find(dcp), std::string::npos) << res.err;
  const std::string error = res.err.substr(res.err.find("error:"));
  EXPECT_EQ(error.find(".ucp-load-universal-"), std::string::npos) << error;  // the error never names the scratch folder
  EXPECT_FALSE(fs::exists(r.work + "/hf"));
  for (const auto& e : fs::directory_iterator(r.work)) ADD_FAILURE() << "left behind: " << e.path();
}

// A native checkpoint with a config.json beside it is taken for a DeepSpeed checkpoint of a transformers model
// (its names the Hugging Face ones: tests/frameworks/ds_hf_export_test.sh judges those). One whose names are not
// (here a Megatron-DeepSpeed GPT, tests/reshard/fixtures.py) is refused naming a tensor the family map wants, exit 1,
// nothing written; --audit is refused for such a source before anything is read (exit 2).
TEST(HfOutput, ACheckpointWithAConfigMustBeInHuggingFaceNames) {
  const Folders r = fresh("hf_named");
  const std::string src = r.root + "/gpt";
  fs::copy(std::string(UCPKIT_BUILD_DIR) + "/fixtures/reshard/gpt_tp1dp2_to_tp2dp3/src", src, fs::copy_options::recursive);
  std::ofstream(src + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64, "vocab_size": 128})";
  auto res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load --input ../gpt --format hf --output hf", r.root);
  EXPECT_EQ(res.rc, 1) << res.err;
  EXPECT_NE(res.err.find("tensor model.embed_tokens.weight is missing"), std::string::npos) << res.err;
  EXPECT_NE(res.err.find("must be the Hugging Face names"), std::string::npos) << res.err;
  EXPECT_FALSE(fs::exists(r.work + "/hf"));
  res = ucpkit::testing::run_split_in(r.work, kBin + "/ucp-load --input ../gpt --format hf --audit a.json --output hf", r.root);
  EXPECT_EQ(res.rc, 2) << res.err;
  EXPECT_NE(res.err.find("already in Hugging Face names"), std::string::npos) << res.err;
  for (const auto& e : fs::directory_iterator(r.work)) ADD_FAILURE() << "left behind: " << e.path();
}

}  // namespace hf_output_test
