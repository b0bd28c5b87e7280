// ucp-load driver: plan, then write every target file once (TBB threads; MPI ranks split the files).
#include "reshard/load.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>

#include <tbb/parallel_for.h>

#include "core/allocator.h"
#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/pickle/pickler.h"
#include "io/torch/torch_file.h"
#include "io/torch/verify.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/version_line.h"
#include "reshard/dcp_output.h"
#include "reshard/deepspeed_writer.h"
#include "reshard/direct_source.h"
#include "reshard/torch_dist_source.h"
#include "reshard/exchange.h"
#include "reshard/layout_record.h"
#include "reshard/safetensors_writer.h"
#include "reshard/torch_dist_output.h"
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
  if (direct) {
    j["input_kind"] = "native";
    j["checksums_compared"] = checksums_compared;
  }
  return j;
}

// Direct mode: the source's extract plan, and its kind (where its data folder is).
struct DirectInput {
  to_universal::ExtractPlan plan;
  formats::FolderKind kind;
};

const DirectInput* Prepared::direct() const {
  const auto* d = std::get_if<std::shared_ptr<const DirectInput>>(&source);
  return d ? d->get() : nullptr;
}

const TorchDistInput* Prepared::torch_dist() const {
  const auto* t = std::get_if<std::shared_ptr<const TorchDistInput>>(&source);
  return t ? t->get() : nullptr;
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
                                 auto s = std::make_unique<DirectSource>(d->plan, p.model, check_image);
                                 if (direct) *direct = s.get();
                                 return s;
                               },
                               [&](const std::shared_ptr<const TorchDistInput>& t) -> std::unique_ptr<AtomicSource> {
                                 return std::make_unique<TorchDistSource>(*t, p.model);
                               }},
                    p.source);
}

// The source set on `reader` for a plan: it reads steps, no fp32 value, so the model files' weights
// are not indexed.
std::unique_ptr<AtomicSource> open_source(const Prepared& p, UniversalReader& reader) {
  auto source = make_source(p, /*check_image=*/false);
  if (source) reader.set_source(source.get());
  return source;
}
}  // namespace

Prepared prepare(const LoadOptions& options) { return prepare(options, kind_of(options)); }

Prepared prepare(const LoadOptions& options, const formats::FolderKind& kind) {
  Prepared p;
  if (!options.template_dir.empty()) {  // a torch_dist save in one pass (torch_dist_source.h)
    if (options.format != OutputFormat::DeepSpeed)
      throw UsageError("--template applies to --format deepspeed (other formats need no Megatron-DeepSpeed model files)");
    if (!kind.is(formats::kTorchDist))
      throw Error(options.input + ": --template needs a Megatron-Core torch_dist checkpoint as --input (a universal folder "
                  "in Megatron-Core names: ucp-union --to-names megatron-deepspeed --template first)");
    std::shared_ptr<const TorchDistInput> t = open_torch_dist_input(options.input, options.template_dir, options.model_map);
    p.model = model_info_from(torch_dist_meta(*t));
    p.source = std::move(t);
  } else if (!options.model_map.empty()) {
    throw UsageError("--model-map applies with --template");
  } else if (kind.is(formats::kUniversal)) {
    p.model = read_model_info(options.input);
  } else {  // a native checkpoint, read directly (issue 18); direct_plan refuses other kinds by name
    auto d = std::make_shared<DirectInput>();
    d->plan = direct_plan(options.input, kind);
    d->kind = kind;
    p.model = model_info_from(direct_meta(d->plan));
    p.source = std::shared_ptr<const DirectInput>(std::move(d));
  }
  if (p.model.manifest_only && options.format == OutputFormat::DeepSpeed)
    throw Error(options.input + "/manifest.json: no DeepSpeed model files (a universal folder made from a DCP or "
                "torch_dist checkpoint, or in Megatron-Core names): --format deepspeed needs them; write --format dcp, "
                "safetensors or torch_dist, or for Megatron-Core names first ucp-union --to-names megatron-deepspeed "
                "--template <Megatron-DeepSpeed universal folder>");
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
  const TargetLayout t = resolve_target(wanted, options.optimizer, p.model);
  if (options.format != OutputFormat::DeepSpeed) {
    // Safetensors (weights only, unsharded), DCP (global tensors): the parallel layout does not apply.
    p.plan.target = t;
    return p;
  }
  p.plan = ucp_info(p.model, t);
  p.record = layout_record(p.plan, p.model);
  p.templates = std::make_shared<const Templates>(p.model.model_files);
  p.moe_line = target_moe_line(p.model, p.plan.target, *p.templates);
  return p;
}

namespace {

using Clock = std::chrono::steady_clock;

// The run's DeepSpeed writer: the shared templates and line, its own copy of the common optimizer state.
std::unique_ptr<DeepSpeedWriter> make_writer(const Prepared& p, UniversalReader& reader) {
  return std::make_unique<DeepSpeedWriter>(p.model, p.plan, reader, pickle::deep_copy(p.model.optimizer_state),
                                           p.templates, p.moe_line);
}

// Every target file laid out through `writer` (pickles built, sources kept, nothing written),
// sorted by path: the same list on every MPI rank.
std::vector<LaidOutFile> lay_out_all(const DeepSpeedWriter& writer, const Prepared& p, const std::string& dir,
                                     int threads) {
  const auto jobs = file_jobs(p.model, p.plan, p.moe_line);
  std::vector<std::vector<LaidOutFile>> per_job(jobs.size());
  parallel::in_arena(threads, [&] {
    tbb::parallel_for(size_t{0}, jobs.size(), [&](size_t k) {
      check_interrupted();
      per_job[k] = writer.lay_out(jobs[k], dir);
    });
  });
  std::vector<LaidOutFile> out;
  for (auto& files : per_job)
    for (auto& f : files) out.push_back(std::move(f));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return out;
}

// More open files than the default soft limit may be needed (exchange: all of a rank's files at once).
void raise_open_file_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// The exchange's inputs: every target file laid out, and the plan made from what they need (the
// same on every rank).
struct ExchangeSetup {
  std::vector<LaidOutFile> files;  // sorted by path
  ExchangePlan plan;
};

ExchangeSetup set_up_exchange(const DeepSpeedWriter& writer, const Prepared& p, const std::string& dir, int ranks,
                              uint64_t batch_bytes, int threads) {
  ExchangeSetup x;
  x.files = lay_out_all(writer, p, dir, threads);
  x.plan = plan_exchange(p.model, file_needs(x.files, p.model, threads), ranks, batch_bytes);
  return x;
}

// The zip record name of every storage of `root` as save_torch_file / DeferredTorchFile name them:
// "archive/data/<k>", k numbering the distinct storages in pickling order (torch_file.cpp's
// pickle_root; the key order torch.save uses too).
std::map<const Storage*, std::string> record_names(const pickle::ValuePtr& root) {
  std::map<const Storage*, std::string> names;
  pickle::PickleOptions po;
  po.storage_id = [&](const std::shared_ptr<Storage>& s) -> pickle::ValuePtr {
    auto it = names.find(s.get());
    if (it == names.end()) it = names.emplace(s.get(), "archive/data/" + std::to_string(names.size())).first;
    return pickle::Value::str(it->second);
  };
  (void)pickle::pickle(root, po);
  return names;
}

// Direct mode's joined plan: where each atomic tensor's elements lie in the source files (byte
// runs, DirectSource::source_json), which atomic elements each target file is made of, and the two
// joined: every byte range of every generated record of every target file with the source file
// byte range it is converted from (`copies`).
nlohmann::json direct_plan_json(const LoadOptions& options, const Prepared& p) {
  UniversalReader reader(p.model, options.input, false);
  DirectSource source(p.direct()->plan, p.model);
  reader.set_source(&source);
  nlohmann::json d = source.source_json();
  nlohmann::json targets = nlohmann::json::array();
  uint64_t target_bytes = 0, copied_src = 0, copied_dst = 0, joined_dst = 0, zero_dst = 0, ncopies = 0;
  if (options.format == OutputFormat::DeepSpeed) {
    const int threads = parallel::thread_count(options.threads);
    const auto writer = make_writer(p, reader);
    const auto files = lay_out_all(*writer, p, p.model.tag, threads);
    const auto needs = file_needs(files, p.model, threads);
    for (size_t f = 0; f < files.size(); ++f) {
      nlohmann::json from = nlohmann::json::array();
      for (const auto& [key, iv] : needs[f].elements)
        from.push_back({{"param", p.model.params[key.first].name},
                        {"state", p.model.states[key.second]},
                        {"elements", iv}});
      target_bytes += needs[f].bytes;
      // [source file, source byte offset, source bytes, record, record byte offset, record bytes];
      // source file -1: a joined parameter's elements (made in memory from every TP copy).
      nlohmann::json copies = nlohmann::json::array(), records = nlohmann::json::object();
      const auto names = record_names(files[f].root);
      for (const auto& st : generated_storages(files[f].root)) {
        const std::string& rec = names.at(st.get());
        const uint64_t es = dtype_size(st->dtype());
        uint64_t covered = 0;
        auto add = [&](int file, uint64_t soff, uint64_t sbytes, uint64_t toff, uint64_t tbytes) {
          covered += tbytes;
          if (file >= 0) copied_src += sbytes, copied_dst += tbytes;
          else joined_dst += tbytes;
          if (!copies.empty()) {
            auto& l = copies.back();
            if (l[0].get<int>() == file && l[3].get<std::string>() == rec &&
                l[4].get<uint64_t>() + l[5].get<uint64_t>() == toff &&
                (file < 0 || l[1].get<uint64_t>() + l[2].get<uint64_t>() == soff)) {
              l[2] = l[2].get<uint64_t>() + sbytes;
              l[5] = l[5].get<uint64_t>() + tbytes;
              return;
            }
          }
          copies.push_back({file, soff, sbytes, rec, toff, tbytes});
        };
        for (const auto& s : files[f].sources_of(st.get())) {
          const int param = s.slot->param;
          const int64_t n = static_cast<int64_t>((s.byte_end - s.byte_begin) / es);
          for_each_run(p.model.params[param].shape, s.slot->slice, s.param_offset, s.param_offset + n,
                       [&](int64_t src, int64_t count, int64_t out) {
                         if (src < 0) return;  // vocabulary padding rows: zeros
                         const uint64_t at = s.byte_begin + static_cast<uint64_t>(out) * es;
                         const bool direct = source.file_runs(
                             param, s.state, src, count, [&](int file, uint64_t off, uint64_t nb, int64_t k) {
                               add(file, off, nb, at + static_cast<uint64_t>(k) * es, nb / 4 * es);
                             });
                         if (!direct) add(-1, 0, 0, at, static_cast<uint64_t>(count) * es);
                       });
        }
        zero_dst += st->nbytes() - covered;
        records[rec] = {{"dtype", std::string(dtype_name(st->dtype()))}, {"bytes", st->nbytes()}};
      }
      ncopies += copies.size();
      targets.push_back({{"file", files[f].path},
                         {"bytes", needs[f].bytes},
                         {"from", std::move(from)},
                         {"records", std::move(records)},
                         {"copies", std::move(copies)}});
    }
  }
  d["targets"] = std::move(targets);
  auto& t = d["totals"];
  t["target_files"] = d["targets"].size();
  t["target_bytes_from_atomics"] = target_bytes;
  t["copies"] = ncopies;
  t["copied_source_bytes"] = copied_src;
  t["copied_target_bytes"] = copied_dst;
  t["joined_target_bytes"] = joined_dst;
  t["zero_target_bytes"] = zero_dst;
  return d;
}

}  // namespace

namespace {
// DCP output: the plan, with each parameter's step read (its kind decides the entry's).
DcpOutput dcp_output_of(const LoadOptions& options, const Prepared& p, UniversalReader& reader) {
  return plan_dcp_output(p.model, p.plan.target.dtype, dcp_target(options.given.world_size),
                         [&](int i) { return reader.step(i); });
}
}  // namespace

nlohmann::json plan_json(const LoadOptions& options) {
  if (options.format == OutputFormat::TorchDist) return torch_dist_plan_json(options);  // reshard/torch_dist_output.h
  auto p = prepare(options);
  if (options.format == OutputFormat::Dcp) {
    UniversalReader reader(p.model, options.input, false);
    const auto source = open_source(p, reader);
    auto j = dcp_output_json(dcp_output_of(options, p, reader));
    j["from_source"] = p.from_source;
    return j;
  }
  if (options.format == OutputFormat::Safetensors) {
    nlohmann::json j;
    j["format"] = std::string(output_format_name(OutputFormat::Safetensors));
    j["dtype"] = std::string(dtype_name(p.plan.target.dtype));
    j["from_source"] = p.from_source;
    auto& shards = j["shards"] = nlohmann::json::array();
    for (const auto& sh : safetensors_shards(p.model, p.plan.target.dtype, options.shard_bytes)) {
      nlohmann::json names = nlohmann::json::array();
      for (int i : sh) names.push_back(p.model.params[i].name);
      shards.push_back(names);
    }
    return j;
  }
  auto j = p.plan.to_json(p.model);
  j["from_source"] = p.from_source;
  j["record"] = p.record;
  const auto& mpi = parallel::MpiSession::get();
  const int ranks = mpi.size();
  const LoadPlan lp = plan_load(options, p.model, p.plan, p.moe_line, p.direct() != nullptr, ranks, mpi.rank(),
                                p.torch_dist() != nullptr);
  j["load"] = lp.to_json(p.model);
  // Which rank writes which file, and reads which atomic tensor in which batch, when the exchange
  // would be used (the files are laid out in memory for it; nothing is written).
  if (lp.exchange) {
    UniversalReader reader(p.model, options.input, false);
    const auto source = open_source(p, reader);
    const auto writer = make_writer(p, reader);
    const auto setup = set_up_exchange(*writer, p, p.model.tag, ranks, options.batch_bytes, parallel::thread_count(options.threads));
    auto& x = j["exchange"] = setup.plan.to_json(p.model);
    auto& writers = x["files"] = nlohmann::json::array();
    for (size_t f = 0; f < setup.files.size(); ++f)
      writers.push_back({{"file", setup.files[f].path}, {"rank", setup.plan.file_ranks[f]}});
  }
  if (p.direct()) j["direct"] = direct_plan_json(options, p);
  return j;
}

namespace {

// Partition buffers are large and short-lived: kept on the heap, every file reuses the pages of the
// previous one (core/allocator.h).
void keep_buffers_on_heap() { keep_large_buffers_on_heap({.trim_threshold = 1 << 30, .top_pad = 64 << 20}); }

// Direct mode: the source files' zip CRC-32 (on unless --no-verify) is computed on the shard bytes as
// they are read for the copy and completed at the end from the bytes no copy read
// (DirectSource::check_source_crcs), instead of a pass over every file when it is opened. This
// switches the check at open off for the run and back on at its end.
class FusedSourceCrc {
 public:
  explicit FusedSourceCrc(const formats::FolderKind& kind)
      : was_on_(verify_files_crc()), fused_(was_on_ && is_direct_input(kind)) {
    if (fused_) set_verify_files_crc(false);
  }
  ~FusedSourceCrc() { set_verify_files_crc(was_on_); }
  FusedSourceCrc(const FusedSourceCrc&) = delete;
  FusedSourceCrc& operator=(const FusedSourceCrc&) = delete;
  bool fused() const { return fused_; }

 private:
  bool was_on_, fused_;
};

// One rank's execution of its LoadPlan: what the steps share, and what they add up.
struct LoadRun {
  const LoadOptions& options;
  const Prepared& prep;
  const LoadPlan& plan;
  parallel::MpiSession& mpi;
  parallel::RankFailure& failed;  // guard() the work of each step, settle() at its end on every rank
  int threads;
  UniversalReader& reader;
  WriteOptions write;              // how each target file is written
  DirectSource* source = nullptr;  // direct mode
  std::atomic<uint64_t> written{0}, files{0};
  ExchangeStats xstats{};
  size_t batches = 0, compared = 0;
  uint64_t crc_bytes_read = 0;
};

// The run's atomic tensors from a direct source (the source's shards, their CRC-32 kept when fused) or a
// torch_dist one; none for a universal folder.
std::unique_ptr<AtomicSource> open_run_source(LoadRun& r, bool fused_crc) {
  std::unique_ptr<AtomicSource> source;
  if (std::holds_alternative<UniversalInput>(r.prep.source)) return source;
  r.failed.guard([&] {
    source = make_source(r.prep, r.options.verify, &r.source);
    if (r.source) r.source->keep_source_crcs(fused_crc);
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

// safetensors: rank 0 writes every shard and the index (settled by the next step).
void write_safetensors_output(LoadRun& r, const std::string& staged) {
  const auto& o = r.options;
  r.failed.guard([&] {
    if (r.mpi.rank() == 0) {
      const DType dtype = r.prep.plan.target.dtype;
      r.written += write_safetensors(r.prep.model, r.reader, dtype, o.shard_bytes, staged, r.threads);
      r.files += safetensors_shards(r.prep.model, dtype, o.shard_bytes).size() + 1;
    }
  });
}

// DCP: rank 0 writes the data files and .metadata (settled by the next step).
void write_dcp_folder(LoadRun& r, const std::string& staged) {
  r.failed.guard([&] {
    if (r.mpi.rank() != 0) return;
    const DcpOutput out = dcp_output_of(r.options, r.prep, r.reader);
    const std::string id = fs::absolute(r.options.output).lexically_normal().string();
    const DcpWritten w = write_dcp_output(out, r.prep.model, r.reader, staged, id);
    r.written += w.bytes;
    r.files += w.files;
  });
}

// The files of job `j`, laid out and saved; refuses a file list other than the plan's.
void write_job(LoadRun& r, const DeepSpeedWriter& writer, const FileJob& j, const std::string& ckdir) {
  const auto files = writer.lay_out(j, ckdir);
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(fs::path(f.path).filename().string());
  std::vector<std::string> want = j.files;
  std::sort(names.begin(), names.end());
  std::sort(want.begin(), want.end());
  if (names != want)
    throw Error(ckdir + ": laid out " + std::to_string(names.size()) + " files where the plan has " +
                std::to_string(want.size()) + " (internal error)");
  for (const auto& f : files) r.written += save_file(f, r.write);
}

// Files mode: this rank's jobs, largest first, all threads at once (rank 0 shows the progress).
void write_my_jobs(LoadRun& r, const DeepSpeedWriter& writer, const std::string& ckdir) {
  const auto& mine = r.plan.my_jobs;
  Reporter::Bar progress(r.options.reporter, "ucp-load", mine.size());
  std::mutex progress_mu;
  parallel::in_arena(r.threads, [&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, mine.size(), 1),
        [&](const tbb::blocked_range<size_t>& range) {
          for (size_t k = range.begin(); k != range.end(); ++k) {
            check_interrupted();
            write_job(r, writer, r.plan.jobs[mine[k]], ckdir);
            if (r.mpi.rank() == 0) {
              std::lock_guard lock(progress_mu);
              progress.advance();
            }
          }
        },
        tbb::simple_partitioner());
  });
  progress.finish();
  r.files += r.plan.my_files();  // each job wrote exactly its planned files (write_job)
}

// DeepSpeed output: the checkpoint folder and `latest` (rank 0), then this rank's files (files
// mode), or every file laid out and the exchange run over all ranks (exchange mode).
void write_deepspeed_output(LoadRun& r, const std::string& staged) {
  const ModelInfo& model = r.prep.model;
  const fs::path ckdir = fs::path(staged) / model.tag;
  r.failed.guard([&] {
    if (r.mpi.rank() == 0) {
      fs::create_directories(ckdir);
      formats::deepspeed::write_latest(staged, model.tag);
      write_file_atomic((fs::path(staged) / kLayoutRecordName).string(), r.prep.record.dump(1) + "\n");
    }
  });
  r.failed.settle();
  r.mpi.barrier();
  std::unique_ptr<DeepSpeedWriter> writer;
  std::optional<ExchangeSetup> setup;
  r.failed.guard([&] {
    writer = make_writer(r.prep, r.reader);
    if (r.plan.exchange) {
      // Every rank lays out every file, and makes the same plan from them: who writes which file,
      // who reads which atomic tensor, in which batch. run_exchange then writes this rank's files.
      raise_open_file_limit();
      setup = set_up_exchange(*writer, r.prep, ckdir.string(), r.mpi.size(), r.options.batch_bytes, r.threads);
      r.batches = setup->plan.batches.size();
      return;
    }
    write_my_jobs(r, *writer, ckdir.string());
  });
  r.failed.settle();
  // Collective; on any rank's failure every rank throws (temporary files and staging removed).
  if (r.plan.exchange) {
    r.xstats = run_exchange(setup->files, r.write, r.reader, model, setup->plan, r.mpi, r.threads, r.options.reporter);
    r.written += r.xstats.bytes_written;
    r.files += r.xstats.files_written;
  }
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

// Every rank flushes its files, then rank 0 renames the staging folder into place.
void commit_output(LoadRun& r, parallel::CollectiveStaging& staging) {
  r.failed.guard([&] {
    if (r.mpi.rank() == 0) test_pause_if_asked();  // output written, not yet renamed into place
    staging.sync_own_files();
    check_interrupted();
  });
  r.failed.settle();
  r.mpi.barrier();
  r.failed.guard([&] { staging.commit(); });
  r.failed.settle();
}

// The counts summed (and times maxed) over the ranks.
LoadSummary summarize(LoadRun& r, Clock::time_point t0) {
  const auto& x = r.xstats;
  LoadSummary s;
  s.output = r.options.output;
  s.format = r.plan.format;
  s.params = r.prep.model.params.size();
  s.ranks = r.mpi.size();
  s.threads = r.threads;
  s.exchange = r.plan.exchange;
  s.direct = r.plan.direct;
  s.checksums_compared = r.compared;
  s.from_source = r.prep.from_source;
  if (!r.prep.record.is_null()) s.target = r.prep.record;
  if (r.plan.format == OutputFormat::Dcp)
    s.target = dcp_target_json(dcp_target(r.options.given.world_size), r.prep.plan.target.dtype);
  s.batches = r.batches;
  if (r.plan.exchange)  // rank 0's phases (every rank waits for the slowest at each all-to-all)
    s.phase_seconds = {{"read", x.read_seconds},
                       {"pack", x.pack_seconds},
                       {"alltoall", x.alltoall_seconds},
                       {"fill", x.fill_seconds},
                       {"finish", x.finish_seconds}};
  if (r.plan.exchange && x.fill_cost_even > 0)
    s.fill_balance = static_cast<double>(x.fill_cost) / static_cast<double>(x.fill_cost_even);
  s.files_written = r.mpi.sum(r.files.load());
  s.bytes_read = r.mpi.sum(r.reader.bytes_read() + r.crc_bytes_read);  // direct: with the bytes read only for the zip CRC-32
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
  if (options.format == OutputFormat::TorchDist) return run_torch_dist_load(options);  // reshard/torch_dist_output.h
  const auto t0 = Clock::now();
  keep_buffers_on_heap();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  const auto kind = kind_of(options);  // read once for the whole run
  refuse_output_over_input(options.output, "--output", input_data_dir(options.input, kind), "--input");
  // Under mpirun each rank checks its share of the files (balanced by bytes) with the pieces it read.
  const FusedSourceCrc crc(kind);
  Reporter::Phase phase(options.reporter, "read source");
  Prepared prep;
  failed.guard([&] { prep = prepare(options, kind); });
  failed.settle();
  if (options.reuse_output && output_holds(options, prep, mpi.rank() == 0)) return reused_summary(options, prep, t0);
  phase.next("plan");
  const LoadPlan plan =
      plan_load(options, prep.model, prep.plan, prep.moe_line, prep.direct() != nullptr, mpi.size(), mpi.rank(),
                prep.torch_dist() != nullptr);

  // Every rank turns SIGINT/SIGTERM into a failure at its next job from here on (staging removed).
  parallel::CollectiveStaging staging(failed, options.output, options.overwrite, "ucp-load", options.reporter.verbose,
                                      options.sync);
  const std::string staged = staging.path().string();
  phase.next("write");
  UniversalReader reader(prep.model, options.input, plan.verify);
  LoadRun run{options, prep, plan, mpi, failed, parallel::thread_count(options.threads), reader};
  // With --sync (the default) every finished target file starts its write-back at once, so the final
  // flush overlaps the writing instead of following it.
  run.write.start_writeback = options.sync;
  const auto source = open_run_source(run, crc.fused());
  if (plan.verify_first) verify_atomic_tensors(run);  // exchange mode verifies while the owner reads
  if (plan.format == OutputFormat::Safetensors) write_safetensors_output(run, staged);
  else if (plan.format == OutputFormat::Dcp) write_dcp_folder(run, staged);
  else write_deepspeed_output(run, staged);
  phase.next("check and commit");
  if (crc.fused()) check_source_crcs(run);
  if (plan.direct && !options.verify_against.empty()) compare_checksums(run);
  commit_output(run, staging);
  return summarize(run, t0);
}

}  // namespace ucpkit::reshard
