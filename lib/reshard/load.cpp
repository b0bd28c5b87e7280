// ucp-load driver: prepare, plan, then the output writer writes every target file once (TBB threads;
// MPI ranks split the files), then check and commit; one path for every output format (output_writer.h).
#include "reshard/load.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <tbb/parallel_for.h>

#include "core/allocator.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/torch/verify.h"
#include "reshard/direct_source.h"
#include "reshard/layout_record.h"
#include "reshard/output_writer.h"
#include "reshard/torch_dist_source.h"
#include "reshard/universal_reader.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "parallel/threads.h"
#include "parallel/staging.h"
#include "to_universal/direct.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

nlohmann::json LoadSummary::to_json() const {
  nlohmann::json j = {{"tool", "ucp-load"},      {"output", output},         {"format", std::string(output_format_name(format))},
          {"params", params},        {"files_written", files_written}, {"bytes_read", bytes_read},
          {"bytes_written", bytes_written}, {"bytes_verified", bytes_verified}, {"seconds", seconds}, {"peak_rss_bytes", peak_rss_bytes},
          {"mpi_ranks", ranks},      {"threads", threads}, {"mode", exchange ? "exchange" : "files"},
          {"batches", batches}, {"phase_seconds", phase_seconds}};
  if (exchange) j["fill_balance"] = fill_balance;
  j["from_source"] = from_source;
  if (!target.empty()) j["target"] = target;
  j["reused"] = reused;
  j["buffers"] = buffers;
  j["items"] = items;
  j["not_carried"] = not_carried;
  if (direct) {
    j["input_kind"] = "native";
    j["checksums_compared"] = checksums_compared;
  }
  return j;
}

const DirectInput* Prepared::direct() const {
  const auto* d = std::get_if<std::shared_ptr<const DirectInput>>(&source);
  return d ? d->get() : nullptr;
}

const TorchDistInput* Prepared::torch_dist() const {
  const auto* t = std::get_if<std::shared_ptr<const TorchDistInput>>(&source);
  return t ? t->get() : nullptr;
}

TorchLoadOptions Prepared::open() const {
  const DirectInput* d = direct();
  return d ? d->open() : TorchLoadOptions{};
}

namespace {
// The folder the data is read from, for the output-over-input check: the universal folder, the
// work folder, or the checkpoint's global_stepN folder (an output beside it is fine).
std::string input_data_dir(const std::string& input, const formats::FolderKind& kind) {
  return is_direct_input(kind) ? native_checkpoint_dir(input, kind) : input;
}
}  // namespace

namespace {
// The input's kind (an unknown folder is refused here, naming what was looked for).
formats::FolderKind kind_of(const LoadOptions& options) { return formats::detect(options.input); }

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};

// The AtomicSource of a direct or torch_dist input (null for a universal folder, read as it is).
// `check_image`: direct mode compares the model files' weights with the fp32 masters (DirectSource).
// `direct`: set to the direct source, when it is one.
std::unique_ptr<AtomicSource> make_source(const Prepared& p, bool check_image, DirectSource** direct = nullptr) {
  return std::visit(Overloaded{[](const UniversalInput&) -> std::unique_ptr<AtomicSource> { return nullptr; },
                               [&](const std::shared_ptr<const DirectInput>& d) -> std::unique_ptr<AtomicSource> {
                                 auto s = std::make_unique<DirectSource>(d->plan, p.model, check_image, d->open());
                                 if (direct) *direct = s.get();
                                 return s;
                               },
                               [&](const std::shared_ptr<const TorchDistInput>& t) -> std::unique_ptr<AtomicSource> {
                                 return std::make_unique<TorchDistSource>(*t, p.model);
                               }},
                    p.source);
}

}  // namespace

std::unique_ptr<AtomicSource> open_plan_source(const Prepared& p, UniversalReader& reader) {
  auto source = make_source(p, /*check_image=*/false);
  if (source) reader.set_source(source.get());
  return source;
}

Prepared prepare(const LoadOptions& options) { return prepare(options, kind_of(options)); }

Prepared prepare(const LoadOptions& options, const formats::FolderKind& kind, bool fused_crc) {
  const OutputWriter& writer = output_writer(options.format);
  Prepared p;
  if (!writer.reads_model_of(options)) {
    writer.prepare(options, p);
    return p;
  }
  if (!options.template_dir.empty()) {  // a torch_dist save in one pass (torch_dist_source.h)
    if (!writer.takes_template())
      throw UsageError("--template applies to --format " + output_formats_that(&OutputWriter::takes_template) +
                       " (other formats need no Megatron-DeepSpeed model files)");
    const TemplateReader open = template_reader(kind);
    if (!open)
      throw Error(options.input + ": --template needs a Megatron-Core torch_dist checkpoint as --input (a universal folder "
                  "in Megatron-Core names: ucp-union --to-names megatron-deepspeed --template first)");
    std::shared_ptr<const TorchDistInput> t = open(options.input, options.template_dir, options.model_map);
    p.model = model_info_from(torch_dist_meta(*t));
    p.source = std::move(t);
  } else if (!options.model_map.empty()) {
    throw UsageError("--model-map applies with --template");
  } else if (kind.is(formats::kUniversal)) {
    p.model = read_model_info(options.input);
  } else {  // a native checkpoint, read directly; direct_plan refuses other kinds by name
    auto d = std::make_shared<DirectInput>();
    d->fused_crc = fused_crc;
    d->plan = direct_plan(options.input, kind, d->open());
    d->kind = kind;
    p.model = model_info_from(direct_meta(d->plan, d->open()));
    p.source = std::shared_ptr<const DirectInput>(std::move(d));
  }
  writer.check_model(options, p.model);
  TargetLayout wanted = options.target;
  p.from_source = apply_source_defaults(wanted, options.given, p.model, options.format);
  if (options.vocab_multiple > 0) {
    p.model.vocab_multiple = options.vocab_multiple;
  } else if (p.model.vocab_multiple_ambiguous && wanted.tp != p.model.source_tp) {
    options.reporter.warning("the vocabulary padding multiple is not recorded (args.make_vocab_size_divisible_by); assuming " +
               std::to_string(p.model.vocab_multiple) + " (pass --vocab-multiple to choose)");
  }
  if (!options.target.ds_line.empty()) {  // a usage error before any work
    if (!p.model.native_moe)
      throw UsageError("--ds-version applies to native DeepSpeed MoE checkpoints; " + options.input + " has no experts");
    (void)formats::deepspeed::moe_version_line(options.target.ds_line);
  }
  p.plan.target = resolve_target(wanted, options.optimizer, p.model);
  writer.prepare(options, p);
  return p;
}

nlohmann::json plan_json(const LoadOptions& options) {
  return output_writer(options.format).plan_json(options, prepare(options));
}

namespace {

using Clock = std::chrono::steady_clock;

// Partition buffers (torch_dist output: parameter states and chunks) are large and short-lived: kept on
// the heap, each reuses the pages of the previous one instead of fresh mappings faulted in and zeroed
// page by page (core/allocator.h).
void keep_buffers_on_heap() { keep_large_buffers_on_heap({.trim_threshold = 1 << 30, .top_pad = 64 << 20}); }

// The run's atomic tensors from a direct source (the source's shards, their CRC-32 kept when fused) or a
// torch_dist one; none for a universal folder.
std::unique_ptr<AtomicSource> open_run_source(LoadRun& r) {
  std::unique_ptr<AtomicSource> source;
  if (std::holds_alternative<UniversalInput>(r.prep.source)) return source;
  r.failed.guard([&] {
    source = make_source(r.prep, r.options.verify, &r.source);
    if (r.source) r.source->keep_source_crcs(r.prep.direct()->fused_crc);
  });
  r.failed.settle();
  r.reader.set_source(source.get());
  return source;
}

// Each atomic tensor verified by one rank (verify_mask) before anything is written, all threads at
// once (verifying lazily inside the jobs would serialize them on the large tensors).
void verify_atomic_tensors(LoadRun& r) {
  const ModelInfo& model = r.prep.model;
  const auto& mask = r.plan.verify_mask;
  r.reader.set_verify_mask(mask);
  r.failed.guard([&] {
    parallel::in_arena(r.threads, [&] {
      tbb::parallel_for(size_t{0}, mask.size() * model.states.size(), [&](size_t k) {
        check_interrupted();
        const size_t i = k / model.states.size();
        if (mask[i]) r.reader.check(static_cast<int>(i), model.states[k % model.states.size()]);
      });
    });
  });
  r.failed.settle();
}

// Direct mode with the fused CRC-32, before the rename (a damaged source leaves nothing): the zip
// records no copy read, in this rank's share of the source files (balanced by bytes).
void check_source_crcs(LoadRun& r) {
  r.failed.guard([&] {
    const DirectInput& direct = *r.prep.direct();
    const auto& plan = direct.plan;
    std::vector<std::string> paths(plan.files);
    paths.insert(paths.end(), plan.model_files.begin(), plan.model_files.end());
    if (!plan.optimizer_state_file.empty()) paths.push_back(plan.optimizer_state_file);
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(native_checkpoint_dir(r.options.input, direct.kind), ec))
      if (e.is_regular_file() && e.path().extension() == ".pt") paths.push_back(e.path().string());
    for (auto& p : paths) p = fs::weakly_canonical(p).string();
    std::sort(paths.begin(), paths.end());
    paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
    std::vector<uint64_t> sizes;
    for (const auto& p : paths) {
      const auto n = fs::file_size(p, ec);
      sizes.push_back(ec ? 0 : n);
    }
    const auto owner = parallel::assign_by_size(sizes, r.mpi.size());
    std::vector<std::string> mine;
    for (size_t f = 0; f < paths.size(); ++f)
      if (owner[f] == r.mpi.rank()) mine.push_back(paths[f]);
    r.crc_bytes_read = r.source->check_source_crcs(mine, r.threads);
  });
  r.failed.settle();
}

// Direct mode with --verify-against, before the rename (a mismatch leaves nothing): the universal
// checksums computed on the way against that manifest, every one of them compared by some rank.
void compare_checksums(LoadRun& r) {
  const auto& against = r.options.verify_against;
  r.failed.guard([&] { r.compared = r.source->compare_with(against); });
  r.failed.settle();
  r.compared = r.mpi.sum(r.compared);
  r.failed.guard([&] {
    const size_t want = r.prep.model.params.size() * r.prep.model.states.size();
    if (r.compared != want)
      throw Error(against + ": " + std::to_string(r.compared) + " of " + std::to_string(want) +
                  " checksums compared (internal error)");
  });
  r.failed.settle();
}

// The counts summed (and times maxed) over the ranks.
LoadSummary summarize(LoadRun& r, const OutputWriter& writer, Clock::time_point t0) {
  LoadSummary s;
  s.output = r.options.output;
  s.format = r.plan.format;
  s.params = r.prep.model.params.size();
  s.buffers = r.prep.model.buffers.size();
  if (r.plan.format == OutputFormat::Dcp) s.items = r.prep.model.items.size();
  else
    for (const auto& i : r.prep.model.items) s.not_carried.push_back(i.key);
  s.ranks = r.mpi.size();
  s.threads = r.threads;
  s.exchange = r.plan.exchange;
  s.direct = r.plan.direct;
  s.checksums_compared = r.compared;
  s.from_source = r.prep.from_source;
  s.batches = r.batches;
  writer.summarize(r, s);
  s.files_written = r.mpi.sum(r.files.load());
  // direct: with the bytes read only for the zip CRC-32
  s.bytes_read = r.mpi.sum(r.reader.bytes_read() + r.crc_bytes_read + r.read);
  s.bytes_verified = r.mpi.sum(r.reader.bytes_verified());
  s.bytes_written = r.mpi.sum(r.written.load());
  s.peak_rss_bytes = r.mpi.max(peak_rss_bytes());
  s.seconds = r.mpi.max(std::chrono::duration<double>(Clock::now() - t0).count());
  return s;
}

// --reuse-output: whether the output folder's layout record is what this run would write. When it
// exists with another record (or none), rank 0 says what differs before it is converted again.
bool output_holds(const LoadOptions& options, const Prepared& prep, bool root) {
  std::error_code ec;
  if (prep.record.is_null() || !fs::exists(options.output, ec)) return false;
  const auto have = read_layout_record(options.output);
  const std::string diff = have ? layout_difference(*have, prep.record) : "";
  if (have && diff.empty()) return true;
  if (root)
    options.reporter.warning(options.output + " holds another layout (" +
                             (have ? diff : std::string("no ") + kLayoutRecordName) + "): converting again" +
                             (options.overwrite ? " (--overwrite)" : ""));
  return false;
}

// A DCP source's bytes entries (LR scheduler, dataloader position, train state, flattened param_groups)
// have no place in the other formats: said by default (a run resumed without them is another
// run) and listed in --json's not_carried. No path: in direct mode the input here is a scratch folder.
void warn_items_not_carried(const LoadOptions& options, const ModelInfo& model) {
  if (model.items.empty()) return;
  std::string names;
  for (size_t k = 0; k < model.items.size() && k < 4; ++k) names += (k ? "', '" : "'") + escaped_brief(model.items[k].key);
  options.reporter.warning(std::to_string(model.items.size()) + " non-tensor DCP entries (" + names + "'" +
                           (model.items.size() > 4 ? ", ..." : "") + ") are not carried into --format " +
                           std::string(output_format_name(options.format)) + " (only --format dcp writes them back)");
}

LoadSummary reused_summary(const LoadOptions& options, const Prepared& prep, Clock::time_point t0) {
  LoadSummary s;
  s.output = options.output;
  s.format = options.format;
  s.params = prep.model.params.size();
  s.ranks = parallel::MpiSession::get().size();
  s.from_source = prep.from_source;
  s.target = prep.record;
  s.reused = true;
  s.peak_rss_bytes = peak_rss_bytes();
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

}  // namespace

LoadSummary run_load(const LoadOptions& options) {
  const OutputWriter& writer = output_writer(options.format);
  const auto t0 = Clock::now();
  keep_buffers_on_heap();
  auto& mpi = parallel::MpiSession::get();
  if (writer.one_process() && mpi.size() > 1)
    throw UsageError("--format " + std::string(output_format_name(options.format)) +
                     " is written by one process (no MPI split yet): run ucp-load without mpirun");
  parallel::RankFailure failed(mpi);
  const auto kind = kind_of(options);  // read once for the whole run
  // A writer that reads the input itself reads all of it, not only a native checkpoint's data folder.
  refuse_output_over_input(options.output, "--output",
                           writer.reads_model_of(options) ? input_data_dir(options.input, kind) : options.input, "--input");
  // Direct mode: the source files' zip CRC-32 (the tools' --verify, on by default) is computed on the
  // shard bytes as they are read for the copy and completed at the end from the bytes no copy read
  // (check_source_crcs), instead of a pass over every file when it is opened. Under mpirun each rank
  // checks its share of the files (balanced by bytes) with the pieces it read.
  const bool fused_crc = verify_files_crc() && writer.reads_model_of(options) && is_direct_input(kind);
  Reporter::Phase phase(options.reporter, "read source");
  Prepared prep;
  failed.guard([&] { prep = prepare(options, kind, fused_crc); });
  failed.settle();
  if (options.reuse_output && output_holds(options, prep, mpi.rank() == 0)) return reused_summary(options, prep, t0);
  writer.announce(options, prep);
  if (options.format != OutputFormat::Dcp && mpi.rank() == 0) warn_items_not_carried(options, prep.model);
  phase.next("plan");
  const LoadPlan plan =
      plan_load(options, prep.model, prep.plan, prep.moe_line, prep.direct() != nullptr, mpi.size(), mpi.rank(),
                prep.torch_dist() != nullptr);

  // Every rank turns SIGINT/SIGTERM into a failure at its next job from here on (staging removed).
  parallel::CollectiveStaging staging(failed, options.output, options.overwrite, "ucp-load",
                                      writer.staging_notes_warn() ? options.reporter.warn : options.reporter.verbose,
                                      options.sync);
  const std::string staged = staging.path().string();
  phase.next("write");
  UniversalReader reader(prep.model, options.input, plan.verify);
  LoadRun run{options, prep, plan, mpi, failed, parallel::thread_count(options.threads), reader};
  // With --sync (the default) every finished target file starts its write-back at once, so the final
  // flush overlaps the writing instead of following it.
  run.write.start_writeback = options.sync;
  const auto source = open_run_source(run);
  if (plan.verify_first) verify_atomic_tensors(run);  // exchange mode verifies while the owner reads
  writer.write(run, staged);
  phase.next("check and commit");
  if (fused_crc) check_source_crcs(run);
  if (plan.direct && !options.verify_against.empty()) compare_checksums(run);
  staging.finish(failed);
  return summarize(run, writer, t0);
}

}  // namespace ucpkit::reshard
