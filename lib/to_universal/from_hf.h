// The two universal forms of a Hugging Face folder (docs/hf.md): in Megatron-Core names (from_hf.cpp, what
// ucp-load --format torch_dist / dcp / hf read) and in transformers' own in-memory names and order with
// DeepSpeed engine model files (from_hf_engine.cpp, what ucp-load --format deepspeed reads). Both start a
// fresh run: fp32 = the weights upcast, exp_avg = exp_avg_sq = 0, step 0.
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "formats/hf/folder.h"
#include "formats/hf/import_plan.h"
#include "io/tensor.h"
#include "formats/hf/export_plan.h"
#include "formats/universal/manifest.h"
#include "io/pickle/value.h"
#include "to_universal/convert.h"
#include "to_universal/union_executor.h"

namespace ucpkit::to_universal {

// The DeepSpeed release whose save code the model files of a fresh run follow (the pinned framework's,
// formats/deepspeed/model_states.h): the engine form's and the Megatron-DeepSpeed template's.
inline constexpr const char* kFreshDsVersion = "0.19.8";

// The import plan of `folder` (the shipped family maps).
formats::hf::ImportPlan hf_import_plan(const formats::hf::Folder& folder);
// Megatron-Core parameter `p`'s value, fp32, read from `folder` and joined as the plan says.
Tensor hf_joined_value(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan, const formats::hf::ImportParam& p);

// The import's Megatron-Core form of `folder` (at `input`) in memory: what its universal folder holds besides the state
// files. The manifest's parameters (plan order, no checksums: nothing is written) and source facts; the common state
// (Megatron args from config.json, a fresh AdamW's param groups, step 0); the universal optimizer state (those param
// groups); the parameter names and whether the args' layer stack is homogeneous (extra_state_objects / _keys).
// ucp-union writes it into the folder; ucp-load --format torch_dist / hf reads the folder through it in one pass
// (reshard/megatron_core_input.h).
struct HfMegatronCore {
  formats::universal::UniversalManifest manifest;
  pickle::ValuePtr common, optimizer;
  std::vector<std::string> names;
  bool stacked = true;
};
HfMegatronCore hf_megatron_core(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan, const std::string& input);
// Plan parameter `param`'s `state` as a fresh run holds it: "fp32" the weights upcast and joined (hf_joined_value),
// "exp_avg" and "exp_avg_sq" zeros (Storage::zero_filled: written as holes, no bytes made); another state is an Error.
Tensor hf_fresh_state(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan, size_t param, const std::string& state);

// One parameter's files in a fresh run's universal form under `zero_dir`: fp32 = `fp32`, exp_avg = exp_avg_sq = 0,
// `step`; its manifest entry and counts in the result.
ParamResult write_fresh_param(const std::filesystem::path& zero_dir, const std::string& name,
                              const std::vector<int64_t>& shape, DType dtype, const Tensor& fp32, const pickle::ValuePtr& step);
// --audit of a Hugging Face import (docs/hf.md "Audit"): `records` (one per tensor written, filled while the parameters
// are written) into the audit document with its totals, dtype changes and experts per layer, written by `job` once
// the folder is in place. Nothing without ConvertOptions::audit. `options`, `plan` and `records` outlive the job.
void write_audit_after_commit(UnionJob& job, const ConvertOptions& options, const std::string& input,
                              const std::string& output, const std::string& conversion,
                              const formats::hf::ImportPlan& plan, const std::vector<nlohmann::json>& records);

// The import's --audit of `input` without a union (ucp-load reading the folder in one pass): the same records, made
// from the folder as the import reads it, naming `output`, written to `path`.
void write_hf_import_audit(const std::string& input, const std::string& output, const std::string& path);

// The engine form's tensors: the import plan, its export plan with fused experts (each in-memory tensor), their
// module order (indices into tensors.tensors) and the tied entries (the head, the embedding).
struct EngineTensors {
  formats::hf::ImportPlan plan;
  formats::hf::ExportPlan tensors;
  std::vector<size_t> order;
  std::vector<std::pair<std::string, std::string>> tied;
};
EngineTensors engine_tensors(const formats::hf::Folder& folder, const std::string& input);
// The engine form's --dry-run counts.
UnionCounts count_union_hf_engine(const std::string& input);

// ucp-union of a Hugging Face folder into the DeepSpeed engine's form (ConvertOptions::hf_engine_names; reached
// through run_union, which has checked the options every Hugging Face union refuses).
RunSummary run_union_hf_engine(const std::string& input, const std::string& output, const ConvertOptions& options);

}  // namespace ucpkit::to_universal
