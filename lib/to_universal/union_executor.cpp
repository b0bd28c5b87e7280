// ucp-union's one executor and the registry of its input formats (union_executor.h).
#include "to_universal/union_executor.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/staging.h"
#include "formats/detect.h"
#include "formats/universal/state_file.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "parallel/staging.h"
#include "parallel/threads.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

namespace {

struct UnionFormat {
  UnionRunner run;
  UnionCounter count;
  bool audits = false;
  bool engine_form = false;
};

NamedTable<UnionFormat>& runners() {
  static NamedTable<UnionFormat> r;
  return r;
}

// The union registered for `input`'s kind; UsageError naming the kinds ucp-union reads when none is.
UnionFormat union_of(const std::string& input) {
  const formats::FolderKind kind = formats::detect(input);
  if (UnionFormat u = runners().find(kind.format); u.run) return u;
  std::string known;
  for (const auto& f : formats::folder_formats())
    if (runners().find(f).run) known += (known.empty() ? "" : ", ") + f;
  throw UsageError("--input " + input + " is a " + kind.name() + " folder: ucp-union reads " + known);
}

}  // namespace

uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

void make_folder(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(dir.string() + ": cannot create folder: " + ec.message());
}

void write_state_file(const fs::path& dir, const std::string& state, const Tensor& value, ParamResult& r) {
  check_interrupted();
  formats::universal::StateFile f;
  f.param = value;
  const std::string path = (dir / (state + ".pt")).string();
  save_torch_file(path, formats::universal::to_pickle(f));
  r.bytes_written += file_size_or_zero(path);
  ++r.files;
  r.manifest.states[state].crc32 = written_crc32(path, f.param);
}

void write_step_file(const fs::path& dir, const pickle::ValuePtr& step, ParamResult& r) {
  const std::string path = (dir / "step.pt").string();
  save_torch_file(path, step);
  r.bytes_written += file_size_or_zero(path);
  ++r.files;
}

RunSummary execute_union(const UnionJob& job, const std::string& output, const ConvertOptions& options,
                         parallel::RankFailure& failed, Reporter::Phase& phase, std::chrono::steady_clock::time_point t0) {
  auto& mpi = parallel::MpiSession::get();
  phase.next(job.write_phase.c_str());
  parallel::CollectiveStaging staging(failed, output, options.overwrite, "ucp", options.reporter.verbose, options.sync,
                                      [&](const fs::path& s) {
                                        for (const auto& f : job.folders) make_folder(s / f);
                                      });
  const auto drop_staging = staging.cleanup();
  const fs::path staged = staging.path(), zero_dir = staged / "zero";

  // This rank's parameters, balanced by bytes, largest first.
  std::vector<uint64_t> sizes(job.params);
  for (size_t i = 0; i < job.params; ++i) sizes[i] = job.bytes(i);
  const std::vector<size_t> mine = parallel::share_of(sizes, mpi.size(), mpi.rank());
  std::vector<ParamResult> results(job.params);
  const int threads = parallel::thread_count(options.threads);
  Reporter::Bar progress(options.reporter, "ucp-union", mine.size(), mpi.rank() == 0);
  failed.guard([&] { convert_each(mine, threads, progress, [&](size_t i) { results[i] = job.write_param(i, zero_dir); }); });
  progress.finish();
  failed.guard([&] { staging.sync_own_files(); });  // rank 0 flushes at commit, with what it writes last
  failed.settle(drop_staging);

  // The manifest entries gathered on rank 0, in plan order; the folder's other files, the manifest last.
  phase.next("manifest and commit");
  nlohmann::json mine_json = nlohmann::json::array();
  CommonFiles t;
  for (size_t i : mine) {
    mine_json.push_back({i, results[i].manifest.to_json()});
    t.bytes_read += results[i].bytes_read;
    t.bytes_written += results[i].bytes_written;
    t.files += results[i].files;
  }
  const auto gathered = mpi.gather(mine_json.dump());
  failed.guard([&] {
    if (mpi.rank() != 0) return;
    formats::universal::UniversalManifest manifest;
    job.write_common(staged, manifest, t);
    manifest.params = gathered_entries(gathered, job.params);
    const fs::path man = staged / formats::universal::kUniversalManifestName;
    write_file_atomic(man.string(), manifest.text());
    t.bytes_written += file_size_or_zero(man.string());
    ++t.files;
    test_pause_if_asked();
    check_interrupted();
    staging.commit();
    if (job.after_commit) job.after_commit();
  });
  failed.settle(drop_staging);
  return union_summary(output, job.params, threads, t.bytes_read, t.bytes_written, t.files, t0);
}

bool register_union(const std::string& format, UnionRunner run, UnionCounter count, bool audits, bool engine_form) {
  return runners().set(format, {std::move(run), std::move(count), audits, engine_form});
}

bool has_union(const std::string& format) { return static_cast<bool>(runners().find(format).run); }

bool union_audits(const std::string& format) { return runners().find(format).audits; }

bool union_writes_engine_form(const std::string& format) { return runners().find(format).engine_form; }

RunSummary run_union(const std::string& input, const std::string& output, const ConvertOptions& options) {
  const UnionFormat u = union_of(input);
  if (!options.audit.empty() && !u.audits)  // before planning: nothing read, nothing written
    throw UsageError("--audit " + options.audit + ": the conversion of " + input +
                     " records no audit (a Hugging Face folder's import does; docs/hf.md)");
  if (!options.audit.empty() && parallel::MpiSession::get().size() > 1)
    throw UsageError("--audit " + options.audit + ": the audit is written by one process; run without mpirun");
  return u.run(input, output, options);
}

UnionCounts count_union(const std::string& input, const ConvertOptions& options) {
  const UnionFormat u = union_of(input);
  if (!u.count) throw UsageError("--dry-run of " + input + ": its format's union says nothing of what it would write");
  return u.count(input, options);
}

}  // namespace ucpkit::to_universal
