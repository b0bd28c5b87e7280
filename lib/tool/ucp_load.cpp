// ucp-load's option check and run.
#include "tool/ucp_load.h"

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/staging.h"
#include "formats/deepspeed/partition.h"
#include "formats/detect.h"
#include "gpu/device_load.h"
#include "io/dtype.h"
#include "io/torch/verify.h"
#include "parallel/mpi_session.h"
#include "reshard/direct_source.h"
#include "reshard/layout_record.h"
#include "reshard/megatron_core_input.h"
#include "reshard/output_writer.h"
#include "reshard/target_defaults.h"
#include "reshard/torch_dist_source.h"
#include "reshard/whole_rewrite.h"
#include "tool/typed_name.h"
#include "tool/ucp_names.h"
#include "to_universal/convert.h"
#include "to_universal/union_executor.h"
#include "to_universal/hf_megatron_deepspeed.h"
#include "to_universal/megatron_core_names.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace ucpkit::tool {

void UcpLoadOptions::check() {
  if (shard_size == 0) throw UsageError(typed_name(args, {"--shard-size", "--shard-size-gb"}) + " must be positive");
  if (batch == 0) throw UsageError(typed_name(args, {"--batch", "--batch-mb"}) + " must be positive");
  load.format = *reshard::output_format_from_name(format);
  load.given = given;
  load.given.world_size = world_size;
  const bool layout_given = given.tp && given.pp && given.dp && given.zero_stage;
  if (device == "cuda" && !layout_given) throw UsageError("--device cuda needs --tp, --pp, --dp and --zero-stage (see --help)");
  if (!plan && device == "cpu" && load.output.empty()) throw UsageError("--output is required (see --help)");
  load.target.tp = tp;
  load.target.pp = pp;
  load.target.dp = dp;
  load.target.zero_stage = zero_stage;
  load.target.ep = ep;
  load.target.etp = etp;
  // What the output format uses of the options (its writer's facts, reshard/output_writer.h): an option
  // it has no use for is refused, not ignored, naming the formats that use it.
  using W = reshard::OutputWriter;
  const W& writer = reshard::output_writer(load.format);
  auto formats_that = [](bool (W::*has)() const) { return reshard::output_formats_that(has); };
  if (!partition_method.empty()) {  // parameters, uniform, type:<regex>, lowercased as DeepSpeed does
    const auto method = formats::deepspeed::parse_partition_method(partition_method);
    if (!writer.takes_pipeline_options())
      throw UsageError("--partition-method applies to --format " + formats_that(&W::takes_pipeline_options) +
                       " (pipeline stages)");
    if (device == "cuda")  // gpu::DeviceLoadRequest carries no method: its plan takes the default
      throw UsageError("--partition-method applies to --device cpu (--device cuda plans with the default)");
    load.target.partition_method = formats::deepspeed::to_string(method);
  }
  if (!layer_types.empty()) {  // the PipelineModule's layer class names (type:<regex>; the layer count)
    if (!writer.takes_pipeline_options())
      throw UsageError("--layer-types applies to --format " + formats_that(&W::takes_pipeline_options) + " (pipeline stages)");
    if (device == "cuda") throw UsageError("--layer-types applies to --device cpu (--device cuda plans with the default)");
    load.target.layer_types = formats::deepspeed::read_layer_types(layer_types);
    load.target.layer_types_file = layer_types;
  }
  load.target.dtype = *dtype_from_name(dtype);
  load.optimizer = optimizer == "zero"   ? reshard::OptimizerKind::Zero
                   : optimizer == "bf16" ? reshard::OptimizerKind::Bf16
                                         : reshard::OptimizerKind::Auto;
  load.verify = verify;
  load.shard_bytes = shard_size;
  load.exchange = exchange == "on"    ? reshard::ExchangeMode::Exchange
                  : exchange == "off" ? reshard::ExchangeMode::Files
                                      : reshard::ExchangeMode::Auto;
  load.batch_bytes = batch;
  if (etp > 0 && !writer.takes_megatron_options())
    throw UsageError("--etp applies to --format " + formats_that(&W::takes_megatron_options) +
                     " (expert tensor parallelism, a Megatron-Core layout dimension)");
  if (!load.megatron_version.empty() && !writer.takes_megatron_options())
    throw UsageError("--megatron-version applies to --format " + formats_that(&W::takes_megatron_options));
  load.fused_experts = hf_experts == "fused";
  if (!hf_experts.empty() && !writer.takes_experts_layout())
    throw UsageError("--hf-experts applies to --format " + formats_that(&W::takes_experts_layout));
  if (exchange == "on" && !writer.takes_exchange())
    throw UsageError("--exchange on applies to --format " + formats_that(&W::takes_exchange));
  if (!load.model_map.empty() && load.template_dir.empty() && !writer.takes_model_map())
    throw UsageError("--model-map applies with --template, or with --format " + formats_that(&W::takes_model_map) +
                     " of a Megatron-DeepSpeed input");
  if (!load.template_dir.empty()) {  // a torch_dist input in one pass (docs/ucp-load.md)
    if (!writer.takes_template())
      throw UsageError("--template applies to --format " + formats_that(&W::takes_template) +
                       " (the Megatron-DeepSpeed model files it gives)");
    if (device == "cuda") throw UsageError("--template applies to --device cpu");
    if (exchange == "off") throw UsageError("--exchange off: a torch_dist input with --template is read in exchange mode");
    if (!load.verify_against.empty()) throw UsageError("--verify-against applies to a native checkpoint input, not with --template");
  }
  if (device == "cpu" && !writer.takes_layout_options()) {
    std::string others = formats_that(&W::takes_layout_options);
    if (const auto comma = others.rfind(", "); comma != std::string::npos) others.replace(comma, 2, " or ");
    const std::pair<bool, const char*> layout[] = {
        {given.tp, "--tp"}, {given.pp, "--pp"}, {given.dp, "--dp"}, {given.zero_stage, "--zero-stage"}, {given.ep, "--ep"}};
    for (const auto& [set, name] : layout)
      if (set)
        throw UsageError(std::string(name) + " does not apply to --format " + format + writer.why_no_layout() +
                         ": leave it out, or write --format " + others);
  }
  if (device == "cpu" && !writer.takes_world_size() && world_size > 0)
    throw UsageError("--world-size does not apply to --format " + format + writer.why_no_layout());
  if (plan || dry_run) return;  // read-only: the rules below concern what a conversion reads
  if (!load.verify_against.empty() && formats::is_kind(load.input, formats::kUniversal))
    throw UsageError("--verify-against applies to a native checkpoint input; " + load.input +
                     " is a universal checkpoint (its own checksums are checked)");
  if (device == "cuda") {
    if (!writer.takes_device())
      throw UsageError("--device cuda loads the " + formats_that(&W::takes_device) + " layout only");
    if (!formats::is_kind(load.input, formats::kUniversal))
      throw UsageError("--device cuda reads a universal checkpoint; " + load.input + " has no manifest.json");
  }
}

namespace {

Result plan_result(const reshard::LoadOptions& load, bool dry_run) {
  const auto j = reshard::plan_json(load);
  if (parallel::MpiSession::get().rank() != 0) return {};
  Result r;
  const bool defaults = j.contains("from_source") && !j["from_source"].empty();
  if (dry_run) {
    r = dry_run_result(load_dry_run(j, load.output, existing_note(load.output, load.overwrite, load.reuse_output)));
    if (defaults) r.notes_before.push_back(reshard::describe_source_defaults(j["from_source"]));
  } else {
    r.document = j.dump(1) + "\n";
    if (defaults) r.notes.push_back(reshard::describe_source_defaults(j["from_source"]));
  }
  return r;
}

Result device_result(const UcpLoadOptions& o) {
  gpu::DeviceLoadRequest req;
  req.universal_dir = o.load.input;
  req.tp = o.tp, req.pp = o.pp, req.dp = o.dp, req.zero_stage = o.zero_stage;
  req.pp_rank = o.pp_rank, req.tp_rank = o.tp_rank, req.dp_rank = o.dp_rank;
  req.verify = o.load.verify;
  const auto d = gpu::load_partition_to_device(req);
  Result r;  // output null: nothing written
  r.fields = {{"device", d.device},
              {"bytes_to_device", d.bytes_to_device},
              {"transfer_seconds", d.seconds},
              {"gbps", d.gbps},
              {"end_to_end_seconds", d.end_to_end_seconds},
              {"end_to_end_gbps", d.end_to_end_gbps},
              {"baseline_pinned_memcpy_gbps", d.baseline_gbps},
              {"phase_seconds", d.phase_seconds},
              {"threads", d.threads},
              {"partition_crc32", d.partition_crc32}};
  r.notes.push_back(std::to_string(d.bytes_to_device) + " bytes to GPU " + std::to_string(d.device) + ": transfers " +
                    std::to_string(d.gbps) + " GB/s, end to end " + std::to_string(d.end_to_end_gbps) +
                    " GB/s (pinned cudaMemcpy: " + std::to_string(d.baseline_gbps) + " GB/s)");
  return r;
}

// ucp-load --input <DCP or Megatron-Core torch_dist folder>: converted by ucp-union's code into a
// scratch universal folder beside the output (.<output name>.ucp-load-universal-<pid>), loaded from
// there, and removed after the load, also when either step fails or a stop signal ends the run
// (docs/ucp-load.md). One a SIGKILLed run left (and the staging folder of its conversion) is removed
// by the next run beside the same output.
class ScratchUniversal {
 public:
  // Collective under mpirun: rank 0 sweeps, names the folder after its own pid and removes it; every rank
  // converts into and loads from that one folder (a name of each rank's own pid gave each rank another,
  // empty folder: rank 1 stopped on "no such folder" while rank 0 waited for it).
  ScratchUniversal(const std::string& output, const StagingNote& note) {
    auto& mpi = parallel::MpiSession::get();
    if (mpi.rank() == 0) {
      const std::filesystem::path out = std::filesystem::absolute(output).lexically_normal();
      const std::string prefix = "." + out.filename().string() + ".ucp-load-universal-";
      sweep_stale_pid_folders(out.parent_path(), prefix, note);
      sweep_stale_pid_folders(out.parent_path(), "." + prefix, note);  // its conversion's staging folder
      path_ = (out.parent_path() / (prefix + std::to_string(getpid()))).string();
      owned_ = std::make_unique<OwnedFolder>(path_);  // rank 0 owns it: removed there only
    }
    if (mpi.size() > 1) path_ = mpi.broadcast(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<OwnedFolder> owned_;
};

// A Hugging Face input written as --format deepspeed: the DeepSpeed engine form of its transformers model
// (to_universal/from_hf.h), whose union writes the engine's model files; with --to-names megatron-deepspeed a fresh
// Megatron-DeepSpeed run's instead (to_universal/hf_megatron_deepspeed.h).
bool hf_deepspeed_input(const formats::FolderKind& kind, reshard::OutputFormat format) {
  return to_universal::union_writes_engine_form(kind.format) && reshard::output_writer(format).needs_model_files();
}
bool megatron_deepspeed_names(const std::string& to_names) { return to_names == "megatron-deepspeed"; }
bool writes_engine_form(const formats::FolderKind& kind, reshard::OutputFormat format, const std::string& to_names = "") {
  return hf_deepspeed_input(kind, format) && !megatron_deepspeed_names(to_names);
}

// A format written from DeepSpeed model files (--format deepspeed), which a DCP or torch_dist input
// has not: refused naming the formats that can be written (the output writers' facts).
void refuse_deepspeed_output(const reshard::LoadOptions& load, const formats::FolderKind& kind) {
  if (!reshard::output_writer(load.format).needs_model_files()) return;
  if (hf_deepspeed_input(kind, load.format)) return;  // its universal form carries engine or fresh-run model files
  std::string others = reshard::output_formats_that(&reshard::OutputWriter::writes_from_tensors);
  if (const auto comma = others.rfind(", "); comma != std::string::npos) others.replace(comma, 2, " or ");
  throw Error(load.input + ": a " + kind.name() + " checkpoint has no DeepSpeed model files, which --format " +
              reshard::output_formats_that(&reshard::OutputWriter::needs_model_files) + " needs; write --format " +
              others +
              (reshard::takes_template_input(kind)
                   ? ", or give --template <the Megatron-DeepSpeed universal folder of the model>"
                   : std::string()) +
              " (docs/ucp-load.md)");
}


// The user's folders, before anything is converted: the load's own checks see only the scratch copy.
void refuse_output_before_converting(const reshard::LoadOptions& load) {
  refuse_output_over_input(load.output, "--output", load.input, "--input");
  check_output_target(load.output, load.overwrite);
  if (!load.template_dir.empty()) refuse_output_over_input(load.output, "--output", load.template_dir, "--template");
}

// The engine form's rules, before anything is converted, and --param-group (a JSON object of hyperparameters for
// its fresh optimizer; an empty object when not given).
nlohmann::json engine_form_options(const UcpLoadOptions& o) {
  const bool tp = o.given.tp && o.tp != 1, zero0 = o.given.zero_stage && o.zero_stage == 0, ep = o.given.ep && o.ep != 1;
  if (o.param_group.empty() && !tp && !zero0 && !ep) return nlohmann::json::object();
  const bool engine = writes_engine_form(formats::detect(o.load.input), o.load.format, o.to_names);
  if (!o.param_group.empty() && !engine)
    throw UsageError("--param-group applies to a Hugging Face input written as --format deepspeed (a fresh optimizer state)");
  // The engine around a transformers model is data-parallel: its module has no tensor-parallel slices.
  if (engine && tp)
    throw UsageError("--tp " + std::to_string(o.tp) + ": the DeepSpeed engine around a transformers model holds whole "
                     "tensors on every rank (data parallel only); give --tp 1 or leave it out");
  // Nor expert-parallel pieces: a transformers MoE block's experts are modules of the model every rank holds whole.
  if (engine && ep)
    throw UsageError("--ep " + std::to_string(o.ep) + ": the DeepSpeed engine around a transformers model holds every "
                     "expert on every rank (data parallel only); leave --ep out, or write --to-names megatron-deepspeed "
                     "(native DeepSpeed MoE) or --format torch_dist");
  // At ZeRO 0 that engine keeps its optimizer state in the model file (DeepSpeed 0.19.8 FP16_UnfusedOptimizer, bf16
  // too); ZeRO 0 here is BF16_Optimizer shards, which it does not read.
  if (engine && zero0)
    throw UsageError("--zero-stage 0: the DeepSpeed engine around a transformers model keeps its ZeRO-0 optimizer state "
                     "in its model file, which is not written; give --zero-stage 1, 2 or 3");
  return o.param_group.empty() ? nlohmann::json::object() : parse_param_group(o.param_group);
}

// An input the load does not read itself (a universal folder) or directly (DeepSpeed shards, a work
// folder) but ucp-union converts (DCP, torch_dist, a format registered later): loaded from its
// universal form, made first in a scratch folder.
bool converted_first(const formats::FolderKind& kind) {
  return !kind.is(formats::kUniversal) && !reshard::is_direct_input(kind) && to_universal::has_union(kind.format);
}

// An error of the load from the scratch folder, told about the user's input: the scratch folder is
// gone by the time the message is read.
[[noreturn]] void rethrow_about_input(const Error& e, const std::string& scratch, const std::string& input) {
  const std::string named = input + " (as converted to universal form)";
  std::string what = e.what();
  for (size_t at = what.find(scratch); at != std::string::npos; at = what.find(scratch, at + named.size()))
    what.replace(at, scratch.size(), named);
  throw Error(what);
}

}  // namespace

// A checkpoint loaded into its own format, rewritten whole (reshard/whole_rewrite.h): every item
// kept, nothing converted through the universal form.
Result whole_rewrite_result(const UcpLoadOptions& o, const reshard::LoadOptions& load, const reshard::WholeRewrite& rw) {
  const bool root = parallel::MpiSession::get().rank() == 0;
  // Options of the universal and DeepSpeed paths mean nothing here: refused, not ignored.
  const std::pair<bool, const char*> unused[] = {{!load.verify_against.empty(), "--verify-against"},
                                                 {load.reuse_output, "--reuse-output"},
                                                 {o.optimizer != "auto", "--optimizer"}};
  for (const auto& [set, name] : unused)
    if (set)
      throw UsageError(std::string(name) + " does not apply when " + load.input + " is written into its own format (" +
                       o.format + "): it is rewritten whole, nothing goes through the universal form");
  if (o.plan || o.dry_run) {
    const nlohmann::json j = rw.plan(load);
    if (!root) return {};
    if (o.plan) {
      Result r;
      r.document = j.dump(1) + "\n";
      return r;
    }
    refuse_output_over_input(load.output, "--output", load.input, "--input");
    const std::string note = existing_note(load.output, load.overwrite);
    DryRun d;
    d.text = "ucp-load --dry-run: " + load.input + " would be rewritten whole as --format " + o.format + " into " +
             load.output + note + " (" + j["entries"].dump() + " entries: " + j["tensors"].dump() + " tensors, " +
             j["bytes_entries"].dump() + " non-tensor items, every one kept; " + std::to_string(j["converted"].size()) + " converted by --dtype); nothing written\n";
    d.fields = {{"dry_run", true}, {"would_write", load.output}, {"format", o.format}};
    for (const char* k : {"input_kind", "route", "target", "entries", "tensors", "bytes_entries", "converted"}) d.fields[k] = j[k];
    return dry_run_result(d);
  }
  const nlohmann::json s = reshard::run_whole_rewrite(rw, load);
  if (!root) return {};
  Result r;
  r.output = load.output;
  r.fields = s;
  r.notes.push_back(load.input + " -> " + load.output + ": rewritten whole (" + s["tensors"].dump() + " tensors, " +
                    s["bytes_entries"].dump() + " non-tensor items, " + s["files_written"].dump() + " files)");
  return r;
}

// --audit: the export's (a writer that takes it), else the import's of an input converted first whose union
// writes one (to_universal::union_audits); written once the output is in place. Refused before anything is read.
bool audits_import(const reshard::LoadOptions& load) {
  return !load.audit.empty() && !reshard::output_writer(load.format).takes_audit();
}

// An input a writer of Megatron-Core names reads in one pass (reshard/megatron_core_input.h: a Hugging Face folder or a
// torch_dist save written as torch_dist or hf): no scratch universal folder; the import's --audit (check_audit let it
// through) is then the reader's, written once the output is in place.
bool read_in_one_pass(const formats::FolderKind& kind, const reshard::LoadOptions& load) {
  const reshard::MegatronCoreReader reader = reshard::megatron_core_reader(kind);
  return reshard::output_writer(load.format).reads_megatron_core_input() && reader.open &&
         (!audits_import(load) || reader.audit) && load.template_dir.empty();
}

void check_audit(const UcpLoadOptions& o) {
  using W = reshard::OutputWriter;
  if (!o.load.audit.empty()) check_file_target(o.load.audit);  // written last, after the commit
  if (!audits_import(o.load)) return;
  const formats::FolderKind kind = formats::detect(o.load.input);
  const bool imported = converted_first(kind) && to_universal::union_audits(kind.format) && o.load.template_dir.empty() &&
                        (!reshard::output_writer(o.load.format).needs_model_files() ||
                         writes_engine_form(kind, o.load.format, o.to_names)) &&
                        o.device == "cpu" && !reshard::whole_rewrite_for(kind, o.load.format).write;
  if (!imported)
    throw UsageError("--audit applies to --format " + reshard::output_formats_that(&W::takes_audit) +
                     ", or to a Hugging Face input (the import's audit, docs/hf.md)");
}

// --to-names: a Hugging Face input written as --format deepspeed; megatron-deepspeed renames it in one process.
void check_to_names(const UcpLoadOptions& o) {
  if (o.to_names.empty()) return;
  if (!hf_deepspeed_input(formats::detect(o.load.input), o.load.format))
    throw UsageError("--to-names applies to a Hugging Face input with --format deepspeed");
  if (!megatron_deepspeed_names(o.to_names)) return;
  if (parallel::MpiSession::get().size() > 1) throw UsageError("--to-names megatron-deepspeed runs in one process (not under mpirun)");
  if (!o.load.audit.empty())
    throw UsageError("--audit with --to-names megatron-deepspeed: write the import's audit with ucp-union --input " +
                     escaped_brief(o.load.input) + " --audit FILE (docs/hf.md)");
  if (!o.plan && !o.dry_run) to_universal::check_hf_megatron_deepspeed(o.load.input);  // before anything is converted
}

// The scratch universal folder of a Hugging Face input in Megatron-DeepSpeed names: its import (Megatron-Core names)
// in `<scratch>-mc`, renamed for a fresh run into `scratch`; the import removed after.
void convert_to_megatron_deepspeed(const std::string& input, const std::string& scratch, const to_universal::ConvertOptions& co,
                                   std::vector<std::string>& not_carried) {
  const OwnedFolder mc(scratch + "-mc");
  not_carried = to_universal::run_union(input, mc.path().string(), co).not_carried;
  to_universal::NamesOptions no;
  no.target = to_universal::NamesTarget::MegatronDeepSpeed;
  no.threads = co.threads;
  no.overwrite = true;
  no.sync = false;
  no.reporter = co.reporter;
  to_universal::rename_universal(mc.path().string(), scratch, no);
}

Result run_ucp_load(const UcpLoadOptions& o) {
  if (!o.verify) set_verify_files_crc(false);
  check_to_names(o);
  check_audit(o);
  const nlohmann::json param_group = engine_form_options(o);
  reshard::LoadOptions load = o.load;
  load.reporter = console_reporter();
  if (load.template_dir.empty() && o.device == "cpu") {
    const reshard::WholeRewrite rw = reshard::whole_rewrite_for(formats::detect(load.input), load.format);
    if (rw.write) return whole_rewrite_result(o, load, rw);
  }
  if ((o.dry_run || o.plan) && load.template_dir.empty()) {
    // A DCP or torch_dist input is converted to universal form before the load can be planned: a dry
    // run says so and what the conversion reads (nothing is converted), --plan points to the two steps.
    const formats::FolderKind kind = formats::detect(load.input);
    if (converted_first(kind) && !read_in_one_pass(kind, load)) {
      const std::string what = kind.name();
      const bool engine_form = writes_engine_form(kind, load.format, o.to_names);
      if (o.plan)
        throw UsageError("--plan of a " + what + " checkpoint: the load is planned from its universal form; run "
                         "ucp-union --input " + load.input +
                         (engine_form                             ? " --to-names transformers"
                          : megatron_deepspeed_names(o.to_names) ? " --to-names megatron-deepspeed"
                                                                 : "") +
                         " --output <folder>, then ucp-load --plan --input <folder>");
      refuse_output_over_input(load.output, "--output", load.input, "--input");
      refuse_deepspeed_output(load, kind);
      const std::string note = existing_note(load.output, load.overwrite);
      to_universal::ConvertOptions count_only;
      count_only.overwrite = true;  // the output was decided on just above; the union counts what it reads
      count_only.hf_engine_names = engine_form;
      const DryRun u = union_dry_run(load.input, load.output, count_only);
      const nlohmann::json params = u.fields.value("params", nlohmann::json(0)), bytes = u.fields.value("bytes", nlohmann::json(0));
      DryRun d;
      d.text = "ucp-load --dry-run: " + load.input + " is a " + what + " checkpoint: it would be converted into a " +
               "scratch universal folder beside " + load.output + " (" + params.dump() + " parameters, " + bytes.dump() +
               " bytes), then written to " + load.output + note + " as --format " + o.format + "; nothing written\n";
      d.fields = {{"dry_run", true}, {"would_write", load.output}, {"input_kind", what}, {"format", o.format},
                  {"params", params}, {"bytes", bytes}};
      return parallel::MpiSession::get().rank() == 0 ? dry_run_result(d) : Result{};
    }
  }
  if (o.dry_run || o.plan) return plan_result(load, !o.plan);
  if (o.device == "cuda") return device_result(o);
  // From here SIGINT/SIGTERM only set a flag until the run has removed what it started (the scratch
  // copy between the conversion and the load included).
  StagedPhase staged;
  std::unique_ptr<ScratchUniversal> scratch;
  std::vector<std::string> not_carried;  // by the conversion into the scratch folder
  std::string scratch_audit;             // the import's audit, in the scratch folder until the output is in place
  const formats::FolderKind kind = formats::detect(load.input);
  const bool one_pass = read_in_one_pass(kind, load);
  const bool via_scratch = converted_first(kind) && !one_pass;
  if (via_scratch) refuse_output_before_converting(load);
  if (reshard::takes_template_input(kind) && !load.template_dir.empty()) {
    // read in one pass through the template's Megatron-DeepSpeed view (reshard/torch_dist_source.h)
  } else if (!load.template_dir.empty()) {
    throw Error(load.input + ": --template needs a Megatron-Core torch_dist checkpoint as --input" +
                (converted_first(kind) ? ", not a " + kind.name() + " one"
                 : kind.is(formats::kUniversal)
                     ? " (a universal folder in Megatron-Core names: ucp-union --to-names megatron-deepspeed --template "
                       "first, then ucp-load)"
                     : std::string()));
  } else if (via_scratch) {
    refuse_deepspeed_output(load, kind);  // before any conversion: name the input, not the scratch
    scratch = std::make_unique<ScratchUniversal>(load.output, [&](const std::string& m) { load.reporter.detail(m); });
    to_universal::ConvertOptions co;
    co.threads = load.threads;
    co.overwrite = true;  // a stale scratch folder of a dead run with this pid
    co.sync = false;      // scratch, removed after the load
    co.tag_latest = false;
    co.reporter = load.reporter;
    // A Hugging Face model written for the DeepSpeed engine: kept in transformers' names and order.
    co.hf_engine_names = writes_engine_form(kind, load.format, o.to_names);
    co.param_group = param_group;
    if (audits_import(load)) {  // the import's: check_audit let it through
      co.audit = (std::filesystem::path(scratch->path()) / ".import-audit.json").string();
      co.audit_output = load.output;
    }
    load.reporter.warning(load.input + " is a " + kind.name() +
                          " checkpoint: converted into the scratch universal folder " + scratch->path() +
                          " first (removed after the load)");
    if (megatron_deepspeed_names(o.to_names))
      convert_to_megatron_deepspeed(load.input, scratch->path(), co, not_carried);
    else
      not_carried = to_universal::run_union(load.input, scratch->path(), co).not_carried;  // said on stderr there
    scratch_audit = co.audit;
    load.input = scratch->path();
  }
  reshard::LoadSummary s;
  try {
    s = reshard::run_load(load);
  } catch (const ReportedElsewhere&) {
    throw;
  } catch (const Error& e) {
    if (!scratch) throw;
    rethrow_about_input(e, scratch->path(), o.load.input);
  }
  // The import's audit, the output in place.
  if (!scratch_audit.empty()) write_file_atomic(load.audit, read_text_file(scratch_audit, "the import's audit"));
  if (one_pass && audits_import(load) && parallel::MpiSession::get().rank() == 0)
    reshard::megatron_core_reader(kind).audit(o.load.input, load.output, load.audit);
  if (parallel::MpiSession::get().rank() != 0) return {};
  s.not_carried.insert(s.not_carried.begin(), not_carried.begin(), not_carried.end());
  Result r;
  r.output = s.output;
  r.fields = s.to_json();
  if (!s.from_source.empty()) r.notes.push_back(reshard::describe_source_defaults(s.from_source));
  r.notes.push_back(s.reused ? load.output + " already holds this layout (" + reshard::kLayoutRecordName +
                                   "): reused, nothing written"
                             : std::to_string(s.params) + " parameters" +
                                   (s.buffers ? ", " + std::to_string(s.buffers) + " buffers" : std::string()) + " -> " +
                                   load.output + " (" +
                                   std::to_string(s.files_written) + " files)");
  return r;
}

}  // namespace ucpkit::tool
