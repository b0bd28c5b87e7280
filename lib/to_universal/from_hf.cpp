// ucp-union --input <Hugging Face folder> (docs/hf.md): the Megatron-Core-named universal folder of the
// model, training-ready as a fresh run starts: fp32 = the weights upcast, exp_avg = exp_avg_sq = 0,
// step 0, and megatron_core/common_state.pt holding Megatron args made from config.json (what
// ucp-load --format torch_dist / hf / dcp read). Names and layouts: the family map read backwards
// (formats/hf/import_plan.h); QKV pieces joined per query group (formats/megatron_core/deepspeed_map.h
// qkv_split_to_grouped), gate/up stacked as SwiGLU's [W; V].
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <span>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/sha256.h"
#include "core/confine.h"
#include "core/staging.h"
#include "formats/detect.h"
#include "formats/hf/folder.h"
#include "formats/hf/import_plan.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/deepspeed_common_state.h"
#include "formats/megatron_core/deepspeed_map.h"
#include "formats/megatron_core/model_facts.h"
#include "formats/universal/state_file.h"
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
constexpr const char* kImportConversion = "import of a Hugging Face folder (its Megatron-Core parameters)";
const std::vector<std::string> kFreshStates = {"fp32", "exp_avg", "exp_avg_sq"};  // a fresh AdamW run's, step 0
}  // namespace

formats::hf::ImportPlan hf_import_plan(const formats::hf::Folder& folder) {
  std::map<std::string, formats::hf::TensorShape> shapes;
  for (const auto& [n, r] : folder.tensors()) shapes[n] = {r.dtype, r.shape};
  return formats::hf::plan_hf_import(formats::hf::shipped_hf_families(), folder.config(), shapes, folder.dir());
}

Tensor hf_joined_value(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan, const formats::hf::ImportParam& p) {
  std::vector<Tensor> parts;
  for (const auto& s : p.sources) {
    Tensor t = folder.read(s);
    if (!dtype_is_floating(t.dtype())) throw Error(folder.dir() + ": tensor " + s + " is " + std::string(dtype_name(t.dtype())) + ", not a floating weight");
    parts.push_back(t.dtype() == DType::Float32 ? t : t.to(DType::Float32));
  }
  Tensor t = parts.size() == 1 ? parts.front() : cat(parts, 0).contiguous(true);
  if (p.index >= 0) t = t.narrow(0, p.index, 1).reshape(p.shape).contiguous(true);  // one expert of a fused tensor
  if (p.merge == formats::hf::Split::Qkv)
    t = formats::megatron_core::qkv_split_to_grouped(t, {plan.heads, plan.kv_heads, plan.head_dim}).contiguous(true);
  return t;
}

ParamResult write_fresh_param(const fs::path& zero_dir, const std::string& name, const std::vector<int64_t>& shape,
                              DType dtype, const Tensor& fp32, const ValuePtr& step) {
  ParamResult r;
  const fs::path dir = zero_dir / param_folder(name);
  make_folder(dir);
  TorchDistParam tp;
  tp.name = name, tp.shape = shape, tp.dtype = dtype;
  r.manifest = torch_dist_entry(tp, kFreshStates, true);
  r.bytes_read += fp32.nbytes();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  // The zero moments written as holes (Storage::zero_filled: nothing made, nothing written).
  const Tensor zeros(Storage::zero_filled(DType::Float32, n), 0, shape, Tensor::contiguous_strides(shape));
  for (const auto& state : kFreshStates) write_state_file(dir, state, state == "fp32" ? fp32 : zeros, r);
  write_step_file(dir, step, r);
  return r;
}

nlohmann::json hf_audit_document(const std::string& input, const std::string& output, const std::string& conversion,
                                 const formats::hf::ImportPlan& plan, const std::vector<nlohmann::json>& records) {
  int64_t values = 0, bytes = 0;
  std::map<std::string, int64_t> changes;  // source tensor -> written weights, per tensor
  for (const auto& r : records) {
    int64_t n = 1;
    for (const auto& d : r["shape"]) n *= d.get<int64_t>();
    values += n, bytes += n * static_cast<int64_t>(dtype_size(*dtype_from_name(r["dtype"].get<std::string>())));
    for (const auto& f : r["from"])
      if (f["dtype"] != r["dtype"]) ++changes[f["dtype"].get<std::string>() + " -> " + r["dtype"].get<std::string>()];
  }
  std::vector<std::string> names;  // experts per layer, counted on the Megatron-Core parameters as every audit counts them
  for (const auto& p : plan.params) names.push_back(p.name);
  return {{"format", "ucpkit-audit"}, {"version", 1}, {"conversion", conversion}, {"input", input},
          {"output", output}, {"family", plan.family},
          {"map", plan.origin}, {"totals", {{"tensors", records.size()}, {"values", values}, {"bytes", bytes}}},
          {"dtype_changes", changes}, {"experts_per_layer", formats::hf::experts_per_layer(names)}, {"tensors", records}};
}

void write_audit_after_commit(UnionJob& job, const ConvertOptions& options, const std::string& input,
                              const std::string& output, const std::string& conversion,
                              const formats::hf::ImportPlan& plan, const std::vector<nlohmann::json>& records) {
  if (options.audit.empty()) return;
  job.after_commit = [&options, &plan, &records, input, output, conversion] {
    const auto doc = hf_audit_document(input, options.audit_output.empty() ? output : options.audit_output, conversion,
                                       plan, records);
    write_file_atomic(options.audit, doc.dump(1) + "\n");
  };
}

namespace {


// The optimizer's param_groups as Megatron-Core's _get_param_groups makes them: weight decay on the
// matrices, none on biases and norms (wd_mult 1 / 0), hyperparameters those of a fresh AdamW; with
// experts, the expert optimizer's two groups after the dense ones (is_expert_parallel, as the torch_dist
// writer's ChainedOptimizer expert part holds them).
ValuePtr fresh_optimizer_state(const formats::hf::ImportPlan& plan) {
  auto is_expert = [](const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; };
  auto group = [&](bool decay, bool expert) {
    auto g = Value::dict();
    std::vector<ValuePtr> params;
    for (size_t i = 0; i < plan.params.size(); ++i)
      if ((plan.params[i].shape.size() > 1) == decay && is_expert(plan.params[i].name) == expert)
        params.push_back(Value::integer(static_cast<int64_t>(i)));
    g->set_item("params", Value::list(std::move(params)));
    g->set_item("lr", Value::real(0.0));
    g->set_item("weight_decay", Value::real(decay ? 0.01 : 0.0));
    g->set_item("betas", Value::tuple({Value::real(0.9), Value::real(0.999)}));
    g->set_item("eps", Value::real(1e-8));
    if (expert) g->set_item("is_expert_parallel", Value::boolean(true));
    return g;
  };
  std::vector<ValuePtr> groups = {group(true, false), group(false, false)};
  if (plan.facts.value("experts", int64_t{0}) > 0) groups.push_back(group(true, true)), groups.push_back(group(false, true));
  auto root = Value::dict();
  root->set_item("param_groups", Value::list(std::move(groups)));
  return root;
}

// The audit record of parameter `p` (docs/hf.md "Audit"): its weights in the model dtype, the bytes a
// torch_dist or DCP output of the import holds for it, hashed; the Hugging Face tensors and how they join.
nlohmann::json audit_record(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan,
                            const formats::hf::ImportParam& p, const Tensor& fp32) {
  const Tensor weights = p.dtype == DType::Float32 ? fp32 : fp32.to(p.dtype);  // exact: the upcast's inverse
  const auto bytes = weights.contiguous_bytes();
  nlohmann::json from = nlohmann::json::array();
  for (const auto& s : p.sources) {
    const auto& t = folder.tensors().at(s);
    from.push_back({{"name", s}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}});
  }
  nlohmann::json transform = nlohmann::json::array();
  if (p.index >= 0) transform.push_back("expert " + std::to_string(p.index) + " of the fused tensor's first axis");
  if (p.merge == formats::hf::Split::Qkv)
    transform.push_back("q_proj, k_proj, v_proj joined per query group [q..., k, v] (" + std::to_string(plan.heads) + " heads, " +
                        std::to_string(plan.kv_heads) + " groups, head size " + std::to_string(plan.head_dim) + ")");
  else if (p.merge == formats::hf::Split::GateUp)
    transform.push_back("gate_proj, up_proj stacked as SwiGLU's [W; V]");
  else if (p.sources.size() > 1)
    transform.push_back("rows concatenated");
  return {{"name", p.name}, {"dtype", std::string(dtype_name(p.dtype))}, {"shape", p.shape},
          {"sha256", sha256_hex(std::span<const uint8_t>(bytes.data(), bytes.size()))}, {"from", from},
          {"transform", transform},
          {"states", "fp32 = the weights cast to float32 (exact); exp_avg = exp_avg_sq = 0; step 0"}};
}

}  // namespace

HfMegatronCore hf_megatron_core(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan,
                                const std::string& input) {
  HfMegatronCore c;
  const std::string config_path = input + "/config.json";
  c.common = formats::megatron_core::fresh_common_state(plan.facts, plan.dtype, fresh_optimizer_state(plan), Value::integer(0),
                                                         config_path);
  // The param groups as the common state holds them, as ucp-union of a torch_dist save writes them: the
  // same model imported and saved by Megatron compares equal (ucp-diff).
  c.optimizer = Value::dict();
  c.optimizer->set_item("param_groups", Value::list(formats::megatron_core::saved_param_groups(c.common, config_path)));
  for (const auto& p : plan.params) {
    c.names.push_back(p.name);
    TorchDistParam tp;
    tp.name = p.name, tp.shape = p.shape, tp.dtype = p.dtype;
    c.manifest.params.push_back(torch_dist_entry(tp, kFreshStates, true));
  }
  c.stacked = formats::megatron_core::args_facts(c.common, config_path).homogeneous;
  auto& source = c.manifest.source;
  source.format = std::string(formats::kHf);
  source.tp = source.pp = source.dp = source.ep = 1;
  source.weights_only = true;
  source.names = "megatron-core";  // what --to-names and the inspector ask (is_megatron_core_named)
  source.facts["hf"] = {{"folder", input}, {"family", plan.family}, {"map", plan.origin},
                        {"architectures", folder.config().value("architectures", nlohmann::json::array())},
                        {"vocab_size", plan.facts.value("vocab", nlohmann::json())}};
  c.manifest.patterns_origin = "none (Hugging Face: whole tensors)";
  c.manifest.patterns_set = nlohmann::json::object();
  return c;
}

Tensor hf_fresh_state(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan, size_t param,
                      const std::string& state) {
  const auto& p = plan.params.at(param);
  if (state == "fp32") return hf_joined_value(folder, plan, p);
  if (std::find(kFreshStates.begin(), kFreshStates.end(), state) != kFreshStates.end()) {  // zeros that say so: holes
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    return Tensor(Storage::zero_filled(DType::Float32, n), 0, p.shape, Tensor::contiguous_strides(p.shape));
  }
  throw Error(folder.dir() + ": " + p.name + " has no state " + state + " (a fresh run's: fp32, exp_avg, exp_avg_sq)");
}

namespace {

RunSummary run_union_hf(const std::string& input, const std::string& output, const ConvertOptions& options) {
  if (!options.patterns_file.empty())
    throw UsageError("--patterns " + options.patterns_file + ": " + input + " is a Hugging Face folder of whole tensors: there are no TP slices to join");
  if (options.hf_engine_names) return run_union_hf_engine(input, output, options);
  const auto t0 = std::chrono::steady_clock::now();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  Reporter::Phase phase(options.reporter, "plan");
  refuse_output_over_input(output, "--output", input, "--input");
  std::unique_ptr<formats::hf::Folder> folder;
  formats::hf::ImportPlan plan;
  failed.guard([&] {
    folder = std::make_unique<formats::hf::Folder>(input);
    plan = hf_import_plan(*folder);
  });
  failed.settle("another MPI rank failed while planning");
  options.reporter.warning(input + ": Hugging Face family " + plan.family + " (" + plan.origin + "), " +
                           std::to_string(plan.params.size()) + " Megatron-Core parameters; optimizer state initialised "
                           "as a fresh run's (exp_avg = exp_avg_sq = 0, step 0)");
  const ValuePtr step = Value::integer(0);

  UnionJob job;
  job.params = plan.params.size();
  // --audit (registered below): one record a parameter, filled by write_param, written once the folder is in place.
  std::vector<nlohmann::json> audit(options.audit.empty() ? 0 : plan.params.size());
  write_audit_after_commit(job, options, input, output, kImportConversion, plan,
                           audit);
  job.folders = {"zero", "megatron_core"};
  job.bytes = [&](size_t i) { return static_cast<uint64_t>(numel_of(plan.params[i].shape)) * 4 * 3; };
  job.write_param = [&](size_t i, const fs::path& zero_dir) {
    const auto& p = plan.params[i];
    const Tensor value = hf_joined_value(*folder, plan, p);
    if (!options.audit.empty()) audit[i] = audit_record(*folder, plan, p, value);
    return write_fresh_param(zero_dir, p.name, p.shape, p.dtype, value, step);
  };
  job.write_common = [&](const fs::path& staged, formats::universal::UniversalManifest& manifest, CommonFiles& t) {
    const HfMegatronCore core = hf_megatron_core(*folder, plan, input);
    const std::vector<std::string> side = {(staged / formats::universal::kUniversalOptimizerState).string(),
                                           (staged / kMcoreCommonStateFile).string(), (staged / kMcoreObjectsFile).string()};
    save_torch_file(side[0], core.optimizer);
    save_torch_file(side[1], core.common);
    save_torch_file(side[2], formats::megatron_core::extra_state_objects(core.names, core.stacked, staged.string()));
    manifest.source = core.manifest.source;
    manifest.patterns_origin = core.manifest.patterns_origin;
    manifest.patterns_set = core.manifest.patterns_set;
    for (const auto& s : side) t.bytes_written += file_size_or_zero(s);
    t.files += side.size();
  };
  return execute_union(job, output, options, failed, phase, t0);
}

}  // namespace

void write_hf_import_audit(const std::string& input, const std::string& output, const std::string& path) {
  const formats::hf::Folder folder(input);
  const formats::hf::ImportPlan plan = hf_import_plan(folder);
  std::vector<nlohmann::json> records;
  for (const auto& p : plan.params) records.push_back(audit_record(folder, plan, p, hf_joined_value(folder, plan, p)));
  write_file_atomic(path, hf_audit_document(input, output, kImportConversion, plan, records).dump(1) + "\n");
}

namespace {

UnionCounts count_union_hf(const std::string& input, const ConvertOptions& options) {
  if (options.hf_engine_names) return count_union_hf_engine(input);
  const formats::hf::Folder folder(input);
  const auto plan = hf_import_plan(folder);
  UnionCounts c;
  c.params = plan.params.size();
  for (const auto& p : plan.params) c.bytes += static_cast<uint64_t>(numel_of(p.shape)) * dtype_size(p.dtype);
  c.atomic_files = c.params * 4;
  c.files = "manifest.json, zero/optimizer_state.pt, megatron_core/common_state.pt, megatron_core/objects.pt";
  c.atomic_note = " (zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt)";
  c.from = "the Hugging Face folder";
  c.input_kind = "hf";
  return c;
}

[[maybe_unused]] const bool kFromHfRegistered = register_union(std::string(formats::kHf), run_union_hf, count_union_hf, true, true);

}  // namespace

}  // namespace ucpkit::to_universal
