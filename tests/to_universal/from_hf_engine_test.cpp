// lib/to_universal/from_hf_engine (run_union with ConvertOptions::hf_engine_names): a tiny Mixtral in the
// per-expert layout save_pretrained writes, written here with a distinct value per element, becomes the
// universal folder of the DeepSpeed engine around transformers' model: in-memory names (router mlp.gate, experts
// fused [E, 2I, H] / [E, H, I]) in named_parameters order, a fresh optimizer, the engine's model file, config.json.
// DeepSpeed itself judges the result in tests/frameworks/ds_hf_import_test.sh.
#include <gtest/gtest.h>

#include <cstdlib>
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
#include "support/paths.h"
#include "to_universal/convert.h"
#include "to_universal/union_executor.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace from_hf_engine_test {
namespace {

using ucpkit::testing::error_of;
using ucpkit::testing::TempDir;

// Tensor number `base` holds base * 100 + i in element i (exact in float32).
SafetensorsTensor f32(std::vector<int64_t> shape, int base) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::string bytes(static_cast<size_t>(n) * 4, '\0');
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(base * 100 + i);
    std::memcpy(bytes.data() + i * 4, &f, 4);
  }
  return {"F32", shape, bytes};
}

std::vector<float> values(int base, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(base * 100 + i);
  return v;
}

// Mixtral: hidden 4, 2 heads of 2 in 1 KV group, 2 experts of 3, top 1, 1 layer, vocabulary 8, untied.
void write_mixtral(const fs::path& d, bool tied = false) {
  fs::create_directories(d);
  std::map<std::string, SafetensorsTensor> t = {
      {"model.embed_tokens.weight", f32({8, 4}, 1)},
      {"model.layers.0.input_layernorm.weight", f32({4}, 2)},
      {"model.layers.0.self_attn.q_proj.weight", f32({4, 4}, 3)},
      {"model.layers.0.self_attn.k_proj.weight", f32({2, 4}, 4)},
      {"model.layers.0.self_attn.v_proj.weight", f32({2, 4}, 5)},
      {"model.layers.0.self_attn.o_proj.weight", f32({4, 4}, 6)},
      {"model.layers.0.post_attention_layernorm.weight", f32({4}, 7)},
      {"model.layers.0.block_sparse_moe.gate.weight", f32({2, 4}, 8)},
      {"model.norm.weight", f32({4}, 9)}};
  for (int e = 0; e < 2; ++e) {
    const std::string p = "model.layers.0.block_sparse_moe.experts." + std::to_string(e) + ".";
    t[p + "w1.weight"] = f32({3, 4}, 10 + e);
    t[p + "w3.weight"] = f32({3, 4}, 20 + e);
    t[p + "w2.weight"] = f32({4, 3}, 30 + e);
  }
  if (!tied) t["lm_head.weight"] = f32({8, 4}, 40);
  std::ofstream(d / "model.safetensors", std::ios::binary) << safetensors_bytes(t);
  const nlohmann::json config = {{"architectures", {"MixtralForCausalLM"}}, {"model_type", "mixtral"}, {"hidden_size", 4},
                                 {"intermediate_size", 3}, {"num_hidden_layers", 1}, {"num_attention_heads", 2},
                                 {"num_key_value_heads", 1}, {"head_dim", 2}, {"max_position_embeddings", 8},
                                 {"vocab_size", 8}, {"rms_norm_eps", 1e-5}, {"tie_word_embeddings", tied},
                                 {"num_local_experts", 2}, {"num_experts_per_tok", 1}, {"router_aux_loss_coef", 0.02},
                                 {"dtype", "float32"}};
  std::ofstream(d / "config.json") << config.dump();
}

ConvertOptions engine_options() {
  ConvertOptions o;
  o.sync = false;
  o.threads = 2;
  o.hf_engine_names = true;
  o.reporter.warn = [](const std::string&) {};
  return o;
}

// A state file's tensor (ds_to_universal's {'param': tensor} form, or the tensor itself).
std::vector<float> state_of(const fs::path& out, const std::string& name, const std::string& state) {
  auto root = load_torch((out / "zero" / name / (state + ".pt")).string());
  return (root->is(pickle::Kind::Dict) ? root->at("param")->as_tensor() : root->as_tensor()).contiguous().to_vector<float>();
}

std::vector<float> fp32_of(const fs::path& out, const std::string& name) { return state_of(out, name, "fp32"); }

TEST(HfEngineUnion, MixtralBecomesTransformersInMemoryTensorsInModuleOrder) {
  TempDir d;
  write_mixtral(d.path() / "hf");
  const fs::path out = d.path() / "u";
  auto o = engine_options();
  o.param_group = {{"lr", 0.01}, {"betas", {0.9, 0.95}}};
  run_union((d.path() / "hf").string(), out.string(), o);

  std::ifstream in(out / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  std::vector<std::string> names;
  for (const auto& p : manifest["params"]) names.push_back(p["name"]);
  // MixtralForCausalLM.named_parameters() (transformers 5.24.0).
  const std::vector<std::string> order = {
      "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate.weight",
      "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
      "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
      "lm_head.weight"};
  EXPECT_EQ(names, order);

  // Unchanged tensors come back as saved; experts stack [w1; w3] and w2 per expert on a new first axis.
  EXPECT_EQ(fp32_of(out, "model.layers.0.self_attn.q_proj.weight"), values(3, 16));
  EXPECT_EQ(fp32_of(out, "model.layers.0.self_attn.k_proj.weight"), values(4, 8));
  EXPECT_EQ(fp32_of(out, "model.layers.0.mlp.gate.weight"), values(8, 8));
  std::vector<float> gate_up, down;
  for (int e = 0; e < 2; ++e) {
    for (int base : {10 + e, 20 + e}) {
      const auto v = values(base, 12);
      gate_up.insert(gate_up.end(), v.begin(), v.end());
    }
    const auto w2 = values(30 + e, 12);
    down.insert(down.end(), w2.begin(), w2.end());
  }
  EXPECT_EQ(fp32_of(out, "model.layers.0.mlp.experts.gate_up_proj"), gate_up);
  EXPECT_EQ(fp32_of(out, "model.layers.0.mlp.experts.down_proj"), down);
  EXPECT_EQ(manifest["params"][6]["shape"], nlohmann::json::array({2, 6, 4}));
  EXPECT_EQ(manifest["params"][7]["shape"], nlohmann::json::array({2, 4, 3}));
  EXPECT_EQ(state_of(out, "model.layers.0.mlp.experts.down_proj", "exp_avg_sq"), std::vector<float>(24, 0.0f));

  // The engine's model file: param_shapes in the same order, steps 0; one AdamW group with the given settings.
  const auto model = load_torch((out / "mp_rank_00_model_states.pt").string());
  const auto shapes = model->at("param_shapes");
  ASSERT_EQ(shapes->items.size(), 1u);
  ASSERT_EQ(shapes->items[0]->entries.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(shapes->items[0]->entries[i].first->s, order[i]);
  EXPECT_EQ(model->at("global_steps")->as_int(), 0);
  EXPECT_EQ(model->at("module")->entries.size(), order.size());
  const auto groups = load_torch((out / "zero" / "optimizer_state.pt").string())->at("param_groups");
  ASSERT_EQ(groups->items.size(), 1u);
  EXPECT_DOUBLE_EQ(groups->items[0]->at("lr")->f, 0.01);
  EXPECT_DOUBLE_EQ(groups->items[0]->at("betas")->items[1]->f, 0.95);
  EXPECT_DOUBLE_EQ(groups->items[0]->at("eps")->f, 1e-8);  // AdamW's default where none is given
  EXPECT_EQ(groups->items[0]->at("params")->items.size(), order.size());
  EXPECT_TRUE(fs::exists(out / "config.json"));
  EXPECT_EQ(manifest["source"]["hf"]["names"], "transformers");
  // --dry-run counts the same tensors (the Megatron-Core form has 11 parameters: q/k/v and each expert's w1/w3 joined).
  const UnionCounts c = count_union((d.path() / "hf").string(), engine_options());
  EXPECT_EQ(c.params, order.size());
  EXPECT_EQ(c.atomic_files, 4 * order.size());
}

TEST(HfEngineUnion, ATiedHeadIsTheEmbeddingInTheModuleAndNoParameter) {
  TempDir d;
  write_mixtral(d.path() / "hf", true);
  std::ofstream(d.path() / "hf" / "generation_config.json") << "{\"bos_token_id\": 1}";
  const fs::path out = d.path() / "u";
  run_union((d.path() / "hf").string(), out.string(), engine_options());
  std::ifstream in(out / "manifest.json");
  const auto manifest = nlohmann::json::parse(in);
  ASSERT_EQ(manifest["params"].size(), 11u);  // no lm_head.weight: named_parameters() gives a tied weight once
  EXPECT_EQ(manifest["params"][10]["name"], "model.norm.weight");
  const auto model = load_torch((out / "mp_rank_00_model_states.pt").string());
  const auto module = model->at("module");
  ASSERT_EQ(module->entries.size(), 12u);
  EXPECT_EQ(module->entries.back().first->s, "lm_head.weight");  // registered last, as in the engine's state_dict
  EXPECT_EQ(model->at("shared_params")->at("lm_head.weight")->s, "model.embed_tokens.weight");

  // Laid out by ucp-load at ZeRO-1: the head in the written module is the embedding's tensor, one storage (the
  // writer gives every shared_params entry its parameter's tensor), holding the embedding's values.
  const fs::path ds = d.path() / "ds";
  const std::string cmd = kBin + "/ucp-load -q --no-sync --input " + out.string() + " --dp 2 --output " + ds.string() + " 2> /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto written = load_torch((ds / "global_step0" / "mp_rank_00_model_states.pt").string())->at("module");
  const Tensor head = written->at("lm_head.weight")->as_tensor(), embed = written->at("model.embed_tokens.weight")->as_tensor();
  EXPECT_EQ(head.storage().get(), embed.storage().get());
  EXPECT_EQ(head.shape(), embed.shape());
  EXPECT_EQ(head.contiguous().to_vector<float>(), values(1, 32));
  // The folder's config.json and generation_config.json travel into both.
  for (const fs::path& f : {out / "config.json", out / "generation_config.json", ds / "config.json", ds / "generation_config.json"})
    EXPECT_TRUE(fs::exists(f)) << f;
}

TEST(HfEngineUnion, TheAuditListsEveryTensorOnceWithItsSources) {
  TempDir d;
  write_mixtral(d.path() / "hf");
  auto o = engine_options();
  o.audit = (d.path() / "a.json").string();
  run_union((d.path() / "hf").string(), (d.path() / "u").string(), o);
  std::ifstream in(o.audit);
  const auto a = nlohmann::json::parse(in);
  ASSERT_EQ(a["tensors"].size(), 12u);
  EXPECT_EQ(a["totals"]["tensors"], 12);
  std::map<std::string, nlohmann::json> by_name;
  for (const auto& r : a["tensors"]) by_name[r["name"]] = r;
  EXPECT_EQ(by_name.size(), 12u);
  const auto& q = by_name.at("model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(q["from"].size(), 1u);
  EXPECT_EQ(q["from"][0]["name"], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_TRUE(q["transform"].empty());
  const auto& gate_up = by_name.at("model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(gate_up["from"].size(), 4u);  // w1 and w3 of both experts
  EXPECT_EQ(gate_up["transform"][0], "2 experts stacked on a new first axis, each [gate; up]");
  EXPECT_EQ(by_name.at("model.layers.0.mlp.gate.weight")["transform"][0], "renamed");
  EXPECT_EQ(a["experts_per_layer"]["0"], 2);
  EXPECT_EQ(q["sha256"].get<std::string>().size(), 64u);
}

}  // namespace
}  // namespace from_hf_engine_test
}  // namespace ucpkit::to_universal
