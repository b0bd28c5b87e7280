// A Hugging Face folder as the DeepSpeed engine around its transformers model would save it before the
// first step (docs/hf.md "DeepSpeed output"): the universal folder in transformers' in-memory names and
// layout (fused experts, transformers 5), in named_parameters order (the family map's module_order: ZeRO
// flattens in that order), one optimizer group, an engine model file (formats/deepspeed
// fresh_engine_model_states) as the template ucp-load's DeepSpeed writer lays out at any ZeRO stage and DP,
// and the folder's config.json beside them. Each tensor is the import's Megatron-Core value put back into
// the Hugging Face layout by the export plan (the same two maps the other directions use): a pure
// rearrangement, bit-exact.
#include <chrono>
#include <filesystem>
#include <algorithm>
#include <limits>
#include <map>
#include <span>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/sha256.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/model_states.h"
#include "formats/hf/engine_plan.h"
#include "formats/hf/export_plan.h"
#include "formats/megatron_core/deepspeed_map.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "to_universal/from_hf.h"
#include "to_universal/from_torch_dist.h"
#include "to_universal/plan.h"
#include "to_universal/union_executor.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using pickle::Value;
using pickle::ValuePtr;

namespace {

// One in-memory tensor `piece`, fp32: its Megatron-Core parameters' values put back into the Hugging Face
// layout (QKV regrouped and split, rows taken, experts stacked on a new first axis).
Tensor engine_value(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan,
                    const formats::hf::ExportPlan& ep, const formats::hf::Piece& piece) {
  std::vector<Tensor> parts;
  for (size_t i : piece.params()) {
    Tensor v = hf_joined_value(folder, plan, plan.params.at(i));
    if (piece.split == formats::hf::Split::Qkv)
      v = formats::megatron_core::qkv_grouped_to_split(v, {ep.heads, ep.kv_heads, ep.head_dim}).contiguous(true);
    if (!v.shape().empty() && (piece.row0 != 0 || piece.rows != v.shape()[0])) v = v.narrow(0, piece.row0, piece.rows);
    if (!piece.stack.empty()) {
      std::vector<int64_t> one = {1};
      one.insert(one.end(), v.shape().begin(), v.shape().end());
      v = v.contiguous(true).reshape(one);
    }
    parts.push_back(std::move(v));
  }
  Tensor t = parts.size() == 1 ? parts.front() : cat(parts, 0);
  t = t.contiguous(true);
  if (t.shape() != piece.shape)
    throw Error(folder.dir() + ": tensor " + piece.name + " comes out as " + shape_str(t.shape()) + ", not " +
                shape_str(piece.shape));
  return t;
}

// A --param-group value: a list is a tuple (torch's betas), a number keeps its kind.
ValuePtr hyperparameter(const nlohmann::json& v) {
  if (v.is_boolean()) return Value::boolean(v.get<bool>());
  if (v.is_number_integer()) return Value::integer(v.get<int64_t>());
  if (v.is_number()) return Value::real(v.get<double>());
  if (v.is_string()) return Value::str(v.get<std::string>());
  if (v.is_array()) {
    std::vector<ValuePtr> items;
    for (const auto& x : v) items.push_back(hyperparameter(x));
    return Value::tuple(std::move(items));
  }
  return Value::none();
}

// torch.optim.AdamW(params)'s one param group (torch 2.15 optim/adamw.py defaults), every parameter in it,
// `given` set over it: what deepspeed.initialize(model, optimizer=AdamW(model.parameters(), **given)) starts with.
ValuePtr fresh_adamw_state(size_t params, const nlohmann::json& given) {
  auto g = Value::dict();
  g->set_item("lr", Value::real(1e-3));
  g->set_item("betas", Value::tuple({Value::real(0.9), Value::real(0.999)}));
  g->set_item("eps", Value::real(1e-8));
  g->set_item("weight_decay", Value::real(1e-2));
  g->set_item("amsgrad", Value::boolean(false));
  g->set_item("maximize", Value::boolean(false));
  g->set_item("foreach", Value::none());
  g->set_item("capturable", Value::boolean(false));
  g->set_item("differentiable", Value::boolean(false));
  g->set_item("fused", Value::none());
  g->set_item("decoupled_weight_decay", Value::boolean(true));
  for (const auto& [k, v] : given.items()) g->set_item(k, hyperparameter(v));
  std::vector<ValuePtr> ids;
  for (size_t i = 0; i < params; ++i) ids.push_back(Value::integer(static_cast<int64_t>(i)));
  g->set_item("params", Value::list(std::move(ids)));
  auto root = Value::dict();
  root->set_item("param_groups", Value::list({g}));  // the release written: the model file's (the writer reads it there)
  return root;
}

// The audit record of in-memory tensor `piece` (docs/hf.md "Audit"): its weights in the model dtype, as the engine's
// module holds them, hashed; the Hugging Face tensors it is made of and how.
nlohmann::json engine_audit_record(const formats::hf::Folder& folder, const EngineTensors& et, const formats::hf::Piece& piece,
                                   const Tensor& fp32) {
  const Tensor weights = et.plan.dtype == DType::Float32 ? fp32 : fp32.to(et.plan.dtype);  // exact: the upcast's inverse
  const auto bytes = weights.contiguous_bytes();
  std::vector<std::string> sources;
  nlohmann::json transform = nlohmann::json::array();
  if (folder.tensors().count(piece.name)) {
    sources = {piece.name};  // the folder holds it as it is in memory
  } else {
    for (size_t i : piece.params())
      for (const auto& s : et.plan.params.at(i).sources)
        if (std::find(sources.begin(), sources.end(), s) == sources.end()) sources.push_back(s);
    if (!piece.stack.empty())
      transform.push_back(std::to_string(piece.stack.size()) + " experts stacked on a new first axis" +
                          (piece.split == formats::hf::Split::None && et.plan.params.at(piece.param).sources.size() == 2
                               ? ", each [gate; up]"
                               : ""));
    else
      transform.push_back("renamed");
  }
  nlohmann::json from = nlohmann::json::array();
  for (const auto& s : sources) {
    const auto& t = folder.tensors().at(s);
    from.push_back({{"name", s}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}});
  }
  return {{"name", piece.name}, {"dtype", std::string(dtype_name(et.plan.dtype))}, {"shape", piece.shape},
          {"sha256", sha256_hex(std::span<const uint8_t>(bytes.data(), bytes.size()))}, {"from", from},
          {"transform", transform},
          {"states", "fp32 = the weights cast to float32 (exact); exp_avg = exp_avg_sq = 0; step 0"}};
}

}  // namespace

EngineTensors engine_tensors(const formats::hf::Folder& folder, const std::string& input) {
  EngineTensors et;
  et.plan = hf_import_plan(folder);
  formats::hf::ExportInput ei;
  for (const auto& p : et.plan.params) ei.names.push_back(p.name), ei.shapes.push_back(p.shape);
  ei.vocab = et.plan.facts.value("vocab", int64_t{0});
  const auto families = formats::hf::shipped_hf_families();
  et.tensors = formats::hf::plan_hf_export(families, et.plan.facts, ei, et.plan.dtype, std::numeric_limits<uint64_t>::max(),
                                           input, true);
  std::vector<std::string> names;
  for (const auto& t : et.tensors.tensors) names.push_back(t.name);
  for (const auto& f : families)
    if (f.family == et.plan.family) {
      et.order = formats::hf::engine_order(f, names, input);
      if (et.plan.facts.value("tied", false)) et.tied.push_back(formats::hf::tied_output(f));
    }
  if (et.order.size() != et.tensors.tensors.size()) throw Error(input + ": no shipped family map " + et.plan.family);
  return et;
}

UnionCounts count_union_hf_engine(const std::string& input) {
  const formats::hf::Folder folder(input);
  const EngineTensors et = engine_tensors(folder, input);
  UnionCounts c;
  c.params = et.order.size();
  for (const auto& t : et.tensors.tensors) c.bytes += static_cast<uint64_t>(numel_of(t.shape)) * dtype_size(et.plan.dtype);
  c.atomic_files = c.params * 4;
  c.files = "manifest.json, zero/optimizer_state.pt, " + formats::deepspeed::model_states_name(0) + ", config.json";
  c.atomic_note = " (zero/<tensor>/{fp32,exp_avg,exp_avg_sq,step}.pt, transformers' names)";
  c.from = "the Hugging Face folder";
  c.input_kind = "hf";
  return c;
}

RunSummary run_union_hf_engine(const std::string& input, const std::string& output, const ConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  Reporter::Phase phase(options.reporter, "plan");
  refuse_output_over_input(output, "--output", input, "--input");
  std::unique_ptr<formats::hf::Folder> folder;
  EngineTensors et;
  failed.guard([&] {
    folder = std::make_unique<formats::hf::Folder>(input);
    et = engine_tensors(*folder, input);
  });
  failed.settle("another MPI rank failed while planning");
  options.reporter.warning(input + ": Hugging Face family " + et.plan.family + " (" + et.plan.origin + "), " +
                           std::to_string(et.order.size()) + " tensors in transformers' names and order for the DeepSpeed "
                           "engine; optimizer state initialised as a fresh run's (exp_avg = exp_avg_sq = 0, step 0), hyperparameters " +
                           (options.param_group.empty() ? std::string("torch.optim.AdamW's defaults (lr 0.001; --param-group sets others)")
                                                        : "AdamW's defaults with " + options.param_group.dump()));
  const ValuePtr step = Value::integer(0);

  UnionJob job;
  job.params = et.order.size();
  // --audit: one record a tensor, filled by write_param, written once the folder is in place.
  std::vector<nlohmann::json> audit(options.audit.empty() ? 0 : et.order.size());
  write_audit_after_commit(job, options, input, output,
                           "import of a Hugging Face folder for the DeepSpeed engine (transformers' in-memory tensors)",
                           et.plan, audit);
  job.bytes = [&](size_t k) { return static_cast<uint64_t>(numel_of(et.tensors.tensors[et.order[k]].shape)) * 4 * 3; };
  job.write_param = [&](size_t k, const fs::path& zero_dir) {
    const auto& piece = et.tensors.tensors[et.order[k]];
    const Tensor value = engine_value(*folder, et.plan, et.tensors, piece);
    if (!options.audit.empty()) audit[k] = engine_audit_record(*folder, et, piece, value);
    return write_fresh_param(zero_dir, piece.name, piece.shape, et.plan.dtype, value, step);
  };
  job.write_common = [&](const fs::path& staged, formats::universal::UniversalManifest& manifest, CommonFiles& t) {
    formats::deepspeed::ParamShapes shapes(1);
    for (size_t i : et.order) shapes[0].emplace_back(et.tensors.tensors[i].name, et.tensors.tensors[i].shape);
    const auto model = formats::deepspeed::fresh_engine_model_states(shapes, et.plan.dtype, 1, kFreshDsVersion, et.tied);
    const std::string model_file = formats::deepspeed::model_states_name(0);
    std::vector<std::string> side = {(staged / model_file).string(),
                                     (staged / formats::universal::kUniversalOptimizerState).string()};
    save_torch_file(side[0], formats::deepspeed::to_pickle(model));
    save_torch_file(side[1], fresh_adamw_state(et.order.size(), options.param_group));
    // The folder's model description travels with it (the HF Trainer keeps both in its checkpoint folder).
    nlohmann::json kept = nlohmann::json::array();
    for (const char* f : {"config.json", "generation_config.json"})
      if (fs::is_regular_file(fs::path(input) / f)) {
        side.push_back((staged / f).string());
        copy_file_contents((fs::path(input) / f).string(), side.back());
        kept.push_back(f);
      }
    manifest.model_files = {model_file};
    manifest.source.tp = manifest.source.pp = manifest.source.dp = manifest.source.ep = 1;
    manifest.source.zero_stage = 1;
    manifest.source.pipeline = false;
    manifest.source.bf16 = false;
    manifest.source.dir = input;
    manifest.source.weights_only = true;
    manifest.source.facts["hf"] = {{"folder", input}, {"family", et.plan.family}, {"map", et.plan.origin},
                                   {"architectures", folder->config().value("architectures", nlohmann::json::array())},
                                   {"names", "transformers"}, {"config", "config.json"}, {"files", kept}};
    manifest.patterns_origin = "none (Hugging Face: whole tensors)";
    manifest.patterns_set = nlohmann::json::object();
    for (const auto& s : side) t.bytes_written += file_size_or_zero(s);
    t.files += side.size();
  };
  return execute_union(job, output, options, failed, phase, t0);
}

}  // namespace ucpkit::to_universal
