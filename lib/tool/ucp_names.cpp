// ucp-union --to-names.
#include "tool/ucp_names.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "core/confine.h"
#include "core/error.h"
#include "io/torch/verify.h"
#include "parallel/mpi_session.h"
#include "formats/detect.h"
#include "to_universal/hf_megatron_deepspeed.h"
#include "to_universal/megatron_core_names.h"
#include "to_universal/union_executor.h"
#include "tool/tool.h"

namespace ucpkit::tool {

namespace fs = std::filesystem;

nlohmann::json parse_param_group(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw UsageError("--param-group: '" + escaped_brief(text, 60) + "' is not JSON");
  }
  if (!j.is_object() || j.contains("params"))
    throw UsageError("--param-group: a JSON object of hyperparameters (lr, betas, eps, weight_decay, ...) without 'params'");
  for (const auto& [k, v] : j.items())
    if (!(v.is_number() || v.is_boolean() || v.is_null() || v.is_string() ||
          (v.is_array() && std::all_of(v.begin(), v.end(), [](const nlohmann::json& x) { return x.is_number(); }))))
      throw UsageError("--param-group: '" + k + "' must be a number, a boolean, null, a string or a list of numbers");
  return j;
}

void check_names_options(const UcpConvertOptions& c, const UcpNamesOptions& n) {
  if (!n.param_group.empty() && n.to_names != "transformers")
    throw UsageError("--param-group is used with --to-names transformers (or ucp-load --format deepspeed of a Hugging Face folder)");
  if (n.to_names.empty()) {
    if (!n.model_map.empty()) throw UsageError("--model-map is used with --to-names megatron-core");
    if (!n.template_dir.empty()) throw UsageError("--template is used with --to-names megatron-deepspeed");
    return;
  }
  if (!n.template_dir.empty() && n.to_names != "megatron-deepspeed")
    throw UsageError("--template is used with --to-names megatron-deepspeed");
  if (n.to_names != "megatron-core" && n.to_names != "megatron-deepspeed" && n.to_names != "transformers")
    throw UsageError("--to-names: '" + escaped_brief(n.to_names, 40) + "' is not megatron-core, megatron-deepspeed or transformers");
  if (n.to_names == "transformers" && !n.model_map.empty()) throw UsageError("--model-map is used with --to-names megatron-core");
  if (c.dry_run) throw UsageError("--dry-run is not available with --to-names");
  if (!c.convert.audit.empty()) throw UsageError("--audit is not available with --to-names");
  if (parallel::MpiSession::get().size() > 1) throw UsageError("--to-names runs in one process (not under mpirun)");
}

// --to-names transformers: a Hugging Face folder's universal form in transformers' own names, order and layout with
// DeepSpeed engine model files (to_universal/from_hf.h), what ucp-load --format deepspeed of the folder reads.
Result run_union_transformers_names(const UcpConvertOptions& c, const UcpNamesOptions& n) {
  if (!to_universal::union_writes_engine_form(formats::detect(c.input).format))
    throw UsageError("--to-names transformers reads a Hugging Face folder; " + escaped_brief(c.input) + " is not one");
  to_universal::ConvertOptions conv = c.convert;
  conv.reporter = console_reporter();
  conv.hf_engine_names = true;
  if (!n.param_group.empty()) conv.param_group = parse_param_group(n.param_group);
  const auto s = to_universal::run_union(c.input, c.output, conv);
  Result r;
  r.output = s.output;
  r.fields = s.to_json();
  r.notes.push_back(std::to_string(s.params) + " tensors in transformers names -> " + c.output);
  return r;
}

Result run_ucp_union_names(const UcpConvertOptions& c, const UcpNamesOptions& n) {
  check_names_options(c, n);
  set_verify_files_crc(c.verify);
  if (n.to_names == "transformers") return run_union_transformers_names(c, n);
  to_universal::NamesOptions o;
  o.target = n.to_names == "megatron-core" ? to_universal::NamesTarget::MegatronCore
                                           : to_universal::NamesTarget::MegatronDeepSpeed;
  o.map_file = n.model_map;
  o.template_dir = n.template_dir;
  o.threads = c.convert.threads;
  o.overwrite = c.convert.overwrite;
  o.sync = c.convert.sync;
  o.reporter = console_reporter();
  std::string family;
  o.family = &family;
  refuse_output_over_input(c.output, "--output", c.input, "--input");
  if (!n.template_dir.empty()) refuse_output_over_input(c.output, "--output", n.template_dir, "--template");
  to_universal::RunSummary s;
  if (formats::is_kind(c.input, formats::kUniversal)) {
    if (!c.convert.patterns_file.empty())
      throw UsageError("--patterns with a universal folder: its patterns are fixed; pass --patterns when converting the checkpoint");
    s = to_universal::rename_universal(c.input, c.output, o);
  } else {
    // A Hugging Face folder: its import (Megatron-Core names) renamed for a fresh Megatron-DeepSpeed run.
    const bool hf = formats::detect(c.input).format == "hf";
    if (o.target != to_universal::NamesTarget::MegatronCore && !hf)
      throw UsageError("--to-names megatron-deepspeed reads a Hugging Face folder or a universal folder made by "
                       "--to-names megatron-core; " + escaped_brief(c.input) + " is neither");
    if (hf && !n.template_dir.empty())
      throw UsageError("--template: a Hugging Face folder takes the model files of a fresh Megatron-DeepSpeed run; "
                       "leave --template out");
    if (hf) to_universal::check_hf_megatron_deepspeed(c.input);  // what it has no place for, naming the folder
    // The checkpoint's universal folder first (Megatron-DeepSpeed names; a Hugging Face folder's in Megatron-Core
    // names), beside the output, then renamed.
    const fs::path out = fs::absolute(c.output);
    const fs::path tmp = out.parent_path() / ("." + out.filename().string() + ".ucp-names-" + std::to_string(getpid()));
    to_universal::ConvertOptions conv = c.convert;
    conv.reporter = o.reporter;
    conv.overwrite = false;
    conv.sync = false;
    conv.tag_latest = false;
    std::error_code ec;
    fs::remove_all(tmp, ec);
    try {
      const auto first = to_universal::run_union(c.input, tmp.string(), conv);
      s = to_universal::rename_universal(tmp.string(), c.output, o);
      s.bytes_read += first.bytes_read;
    } catch (...) {
      fs::remove_all(tmp, ec);
      throw;
    }
    fs::remove_all(tmp, ec);
  }
  Result r;
  r.output = s.output;
  r.fields = s.to_json();
  r.notes_before.push_back("model family " + family);
  r.notes.push_back(std::to_string(s.params) + " parameters in " + n.to_names + " names -> " + c.output);
  return r;
}

}  // namespace ucpkit::tool
