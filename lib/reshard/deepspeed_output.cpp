// ucp-load --format deepspeed: the OutputWriter of a DeepSpeed checkpoint for the target layout
// (output_writer.h), written with DeepSpeedWriter (deepspeed_writer.h): its part of prepare (UcpInfo plan,
// layout record, templates, native-MoE line), its --plan JSON (with the exchange's and direct mode's plans),
// and its write in files mode (each rank its jobs) or exchange mode (exchange.h).
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/staging.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/version_line.h"
#include "io/pickle/pickler.h"
#include "reshard/deepspeed_writer.h"
#include "reshard/direct_source.h"
#include "reshard/exchange.h"
#include "reshard/layout_record.h"
#include "reshard/output_writer.h"
#include "parallel/threads.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

namespace {

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
      for (const auto& f : model.hf_files) copy_file_contents(f, (fs::path(staged) / fs::path(f).filename()).string());
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

class DeepSpeedOutput final : public OutputWriter {
 public:
  bool takes_template() const override { return true; }
  bool takes_pipeline_options() const override { return true; }
  bool takes_exchange() const override { return true; }
  bool takes_device() const override { return true; }
  bool needs_model_files() const override { return true; }
  bool writes_file_jobs() const override { return true; }

  void check_model(const LoadOptions& options, const ModelInfo& model) const override {
    if (model.manifest_only)
      throw Error(options.input + "/manifest.json: no DeepSpeed model files (a universal folder made from a DCP or "
                  "torch_dist checkpoint, or in Megatron-Core names): --format deepspeed needs them; write --format dcp, "
                  "safetensors or torch_dist, or for Megatron-Core names first ucp-union --to-names megatron-deepspeed "
                  "--template <Megatron-DeepSpeed universal folder>");
    // A DeepSpeed source's buffers travel in its model files' module (the templates); a manifest's own
    // buffers have no such source here, and are refused rather than dropped.
    if (!model.buffers.empty())
      throw Error(options.input + "/manifest.json: " + formats::universal::describe_buffers(model.buffers) +
                  " beside DeepSpeed model files: --format deepspeed writes the module from those files only; write "
                  "--format dcp or safetensors, which keep them");
  }

  void prepare(const LoadOptions&, Prepared& p) const override {
    p.plan = ucp_info(p.model, p.plan.target);
    p.record = layout_record(p.plan, p.model);
    p.templates = std::make_shared<const Templates>(p.model.model_files, p.open());
    p.moe_line = target_moe_line(p.model, p.plan.target, *p.templates);
  }

  // The UcpInfo as JSON, with `from_source`, the layout `record`, this rank's LoadPlan (`load`), the
  // exchange's plan when it would be used, and direct mode's joined plan.
  nlohmann::json plan_json(const LoadOptions& options, const Prepared& p) const override {
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
      const auto source = open_plan_source(p, reader);
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

  void write(LoadRun& r, const std::string& staged) const override { write_deepspeed_output(r, staged); }

  void summarize(const LoadRun& r, LoadSummary& s) const override {
    const auto& x = r.xstats;
    s.target = r.prep.record;
    if (r.plan.exchange)  // rank 0's phases (every rank waits for the slowest at each all-to-all)
      s.phase_seconds = {{"read", x.read_seconds},
                         {"pack", x.pack_seconds},
                         {"alltoall", x.alltoall_seconds},
                         {"fill", x.fill_seconds},
                         {"finish", x.finish_seconds}};
    if (r.plan.exchange && x.fill_cost_even > 0)
      s.fill_balance = static_cast<double>(x.fill_cost) / static_cast<double>(x.fill_cost_even);
  }
};

[[maybe_unused]] const bool kDeepspeedOutputRegistered =
    register_output_writer(OutputFormat::DeepSpeed, std::make_shared<DeepSpeedOutput>());

}  // namespace

}  // namespace ucpkit::reshard
