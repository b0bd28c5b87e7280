// A fresh Megatron-DeepSpeed run's template for a Hugging Face import (hf_megatron_deepspeed.h): the import's config
// facts as Megatron-DeepSpeed's GPT (formats/deepspeed/megatron_gpt.h: GPTModelPipe dense, GPTModel with native
// DeepSpeed MoE), its parameters as universal manifest entries, the import's optimizer hyper-parameters.
#include "to_universal/hf_megatron_deepspeed.h"

#include <cmath>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/megatron_gpt.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/megatron_core/deepspeed_common_state.h"
#include "formats/megatron_core/model_facts.h"
#include "io/torch/torch_file.h"
#include "patterns/pattern_set.h"
#include "to_universal/direct.h"
#include "to_universal/from_hf.h"
#include "to_universal/from_torch_dist.h"
#include "to_universal/plan.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using nlohmann::json;
using pickle::Value;
using pickle::ValuePtr;
namespace uv = formats::universal;
namespace ds = formats::deepspeed;

namespace {

// The DeepSpeed version line of kFreshDsVersion's MoE files (formats/deepspeed/version_line.h: 0.19.5 on).
constexpr const char* kFreshMoeLine = "0.19.5";

// The model Megatron-DeepSpeed's GPT computes with these weights, or an Error naming what it has no place for.
ds::MegatronGpt megatron_gpt(const json& f, int64_t vocab, DType dtype, const std::string& where) {
  auto refuse = [&](const std::string& what) {
    throw Error(where + ": " + what + "; Megatron-DeepSpeed's GPT has no place for it (docs/hf.md "
                "\"Megatron-DeepSpeed output\"); --format torch_dist or the DeepSpeed engine form hold it");
  };
  if (f.value("linear_bias", false)) refuse("biases on the linear layers");
  if (f.value("qkv_bias", false)) refuse("a query/key/value bias (Qwen2's attention)");
  if (f.value("qk_norm", false)) refuse("query and key norms (Qwen3's attention)");
  const int64_t experts = f.value("experts", int64_t{0});
  if (experts > 0 && !f.value("dense_layers", json::array()).empty())
    refuse("dense layers between the MoE layers (native DeepSpeed MoE is written in every layer here)");
  if (f.value("shared_ffn", int64_t{0}) > 0) refuse("a shared expert");
  if (experts > 0 && f.value("moe_pre_softmax", false)) refuse("the router's softmax before the top k");
  if (f.value("rope_llama3_factor", 0.0) > 0) refuse("Llama 3's rope scaling");
  const double theta = f.at("rope_theta").get<double>();
  if (theta != std::floor(theta) || theta < 1 || theta > 9e15)
    refuse("rope_theta " + f.at("rope_theta").dump() + ", not an integer (--rotary-position-embeddings-theta is an int)");
  ds::MegatronGpt m;
  m.hidden = f.at("hidden");
  m.ffn = experts > 0 ? f.at("moe_ffn").get<int64_t>() : f.at("ffn").get<int64_t>();
  m.experts = experts;
  m.topk = experts > 0 ? f.at("moe_topk").get<int64_t>() : 1;
  m.aux_loss = f.value("moe_aux_loss", 0.0);
  m.layers = f.at("layers");
  m.heads = f.at("heads");
  m.kv_heads = f.at("kv_heads");
  m.head_dim = f.at("head_dim");
  m.max_positions = f.at("max_positions");
  m.vocab = vocab;
  m.norm_eps = f.at("norm_eps");
  m.rope_theta = static_cast<int64_t>(theta);
  m.tied = f.value("tied", false);
  m.dtype = dtype;
  return m;
}

// DeepSpeed's universal optimizer state: the import's two groups' hyper-parameters, one params entry each; with
// experts a third, DeepSpeed's MoE group (moe/utils.py split_params_into_different_moe_groups_for_optimizer: the
// weight-decay group's experts, named by their EP size).
ValuePtr optimizer_state(const ValuePtr& param_groups, bool experts, const std::string& where) {
  // The import's dense groups come first (an MoE import's expert groups after them hold the same values).
  if (!param_groups || !param_groups->is_sequence() || param_groups->items.size() < 2)
    throw Error(where + ": zero/optimizer_state.pt: not the Megatron param groups of an import");
  std::vector<ValuePtr> groups;
  for (size_t g = 0; g < 2; ++g) {
    const auto& from = param_groups->items[g];
    if (!from || from->kind != pickle::Kind::Dict) throw Error(where + ": zero/optimizer_state.pt: a param group is not a dict");
    auto to = Value::dict();
    for (const char* k : {"lr", "betas", "eps", "weight_decay"})
      if (auto v = from->get(k)) to->set_item(k, v);
    to->set_item("amsgrad", Value::boolean(false));
    to->set_item("bias_correction", Value::boolean(true));
    to->set_item("params", Value::list({Value::integer(static_cast<int64_t>(g))}));
    groups.push_back(to);
  }
  if (experts) groups.push_back(ds::expert_param_group(groups.front(), 1, 2));
  auto out = Value::dict();
  out->set_item("param_groups", Value::list(std::move(groups)));
  return out;
}

}  // namespace

FreshMegatronDeepSpeed fresh_megatron_deepspeed(const json& facts, int64_t vocab, DType dtype, const ValuePtr& param_groups,
                                                const std::string& where) {
  const ds::MegatronGpt model = megatron_gpt(facts, vocab, dtype, where);
  const ds::MegatronGptLayout layout = ds::megatron_gpt_layout(model);
  const auto& set = layout.checkpoint_patterns;

  FreshMegatronDeepSpeed out;
  uv::UniversalManifest& m = out.manifest;
  m.patterns_origin = "checkpoint";
  m.patterns_set = set.to_json();
  m.model_files = {ds::model_states_name(0)};
  for (const auto& [name, shape, layer, expert] : layout.params) {
    uv::UniversalParam e;
    e.name = name;
    e.shape = shape;
    e.dtype = "float32";
    for (const char* s : {"fp32", "exp_avg", "exp_avg_sq"})
      e.states[s] = {"zero/" + param_folder(name) + "/" + s + ".pt", std::nullopt};
    ParamPlan plan;
    plan.name = name;
    plan.tp_shapes = {shape};
    plan.step_file = 0;  // step.pt: the import's (step 0)
    plan.moe_layer = layer;
    plan.expert = expert;
    describe_manifest_entry(e, plan, patterns::classify(set, name), false);
    m.params.push_back(std::move(e));
  }
  uv::UniversalSource& src = m.source;
  src.tp = src.pp = src.dp = src.ep = 1;
  src.zero_stage = 1;
  src.pipeline = layout.pipeline;
  src.bf16 = dtype == DType::BFloat16;
  src.tag = "global_step0";
  src.data_before_expert = false;
  src.num_experts = layout.num_experts;
  src.expert_files = 0;
  for (int n : layout.num_experts) src.expert_files = *src.expert_files + n;
  if (!layout.pipeline) src.ds_line = kFreshMoeLine;
  src.weights_only = true;
  if (layout.pipeline) {
    src.layer_keys = layout.layer_keys;
    src.pipeline_numbering = ds::to_json(layout.numbering);
  }
  out.model_states = ds::fresh_megatron_gpt_model_states(
      model, layout, formats::megatron_core::megatron_deepspeed_args(model, layout.padded_vocab), kFreshDsVersion);
  out.optimizer_state = optimizer_state(param_groups, !layout.pipeline, where);
  return out;
}

void check_hf_megatron_deepspeed(const std::string& hf_folder) {
  const formats::hf::Folder folder(hf_folder);
  const auto plan = hf_import_plan(folder);
  (void)megatron_gpt(plan.facts, plan.facts.value("vocab", int64_t{0}), plan.dtype, hf_folder);
}

bool is_hf_import(const uv::UniversalManifest& m) {
  return m.source.format_name() == "hf" && m.source.names == "megatron-core" && m.source.weights_only.value_or(false);
}

void write_fresh_megatron_deepspeed(const std::string& imported, const std::string& dir) {
  const fs::path in(imported), out(dir);
  const std::string mfile = (in / uv::kUniversalManifestName).string();
  const uv::UniversalManifest m = uv::read_universal_manifest(mfile);
  if (!is_hf_import(m)) throw Error(mfile + ": not a Hugging Face import in Megatron-Core names");
  const std::string common_file = (in / kMcoreCommonStateFile).string();
  const json facts = formats::megatron_core::model_facts(load_torch(common_file), common_file);
  int64_t vocab = 0;
  std::optional<DType> dtype;
  for (const auto& p : m.params) {
    if (p.name == "embedding.word_embeddings.weight" && !p.shape.empty()) vocab = p.shape[0];
    if (!dtype && p.dtype) dtype = dtype_from_name(*p.dtype);
  }
  if (vocab <= 0 || !dtype) throw Error(mfile + ": no embedding.word_embeddings.weight or model dtype");
  const auto opt = load_torch((in / m.optimizer_state).string());
  const auto fresh = fresh_megatron_deepspeed(facts, vocab, *dtype, pickle::entry_of(opt, "param_groups"), imported);
  fs::create_directories(out / "zero");
  save_torch_file((out / fresh.manifest.model_files.front()).string(), fresh.model_states);
  save_torch_file((out / uv::kUniversalOptimizerState).string(), fresh.optimizer_state);
  write_file_atomic((out / uv::kUniversalManifestName).string(), fresh.manifest.text());
}

}  // namespace ucpkit::to_universal
