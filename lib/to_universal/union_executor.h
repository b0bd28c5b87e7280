// ucp-union's one executor and its registry of input formats. Every input format plans its
// own parameters and hands the executor a UnionJob: how to write parameter i, and the folder's other
// files. The executor owns what every union does the same way: the staging folder, the split of the
// parameters over MPI ranks (by bytes) and TBB threads, progress, flushing, the manifest gathered on
// rank 0, the commit and the summary.
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/reporter.h"
#include "formats/universal/manifest.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "parallel/mpi_session.h"
#include "to_universal/convert.h"

namespace ucpkit::to_universal {

// What writing one parameter gave: its manifest entry and what it read and wrote.
struct ParamResult {
  formats::universal::UniversalParam manifest;
  uint64_t bytes_read = 0, bytes_written = 0, files = 0;
};

// What every union's writer uses: a written file's size (0 when it cannot be read: the totals are a
// report, not a check), and a folder created with its parents (Error naming it when it cannot be).
uint64_t file_size_or_zero(const std::string& path);
void make_folder(const std::filesystem::path& dir);
// A universal state file: `value` saved as `dir`/<state>.pt ({'param': value}), its crc32 set in
// r.manifest.states[state] and the file counted in `r`.
void write_state_file(const std::filesystem::path& dir, const std::string& state, const Tensor& value, ParamResult& r);
// `step` saved as `dir`/step.pt, counted in `r`.
void write_step_file(const std::filesystem::path& dir, const pickle::ValuePtr& step, ParamResult& r);

// Rank 0's totals of the folder's other files (added to the parameters').
struct CommonFiles {
  uint64_t bytes_read = 0, bytes_written = 0, files = 0;
};

struct UnionJob {
  size_t params = 0;
  std::function<uint64_t(size_t i)> bytes;  // of parameter i's source tensors: the split over MPI ranks
  // Writes parameter i's files under `zero_dir` (called from TBB threads, one parameter a task).
  std::function<ParamResult(size_t i, const std::filesystem::path& zero_dir)> write_param;
  // Rank 0, after every parameter: the folder's other files into `staged` (counted in `t`), and the
  // manifest's fields but its params (source, patterns, model files). The executor writes the manifest last.
  std::function<void(const std::filesystem::path& staged, formats::universal::UniversalManifest& manifest, CommonFiles& t)>
      write_common;
  std::vector<std::string> folders = {"zero"};  // created in the staging folder first
  std::string write_phase = "write parameters";  // the phase's name in progress and --json
  std::function<void()> after_commit;            // rank 0, once the folder is in place (may be empty)
};

// Runs `job` into `output` (collective: every MPI rank calls it with the same job). `phase` moves on
// from the caller's planning phase; `t0` is when the run started.
RunSummary execute_union(const UnionJob& job, const std::string& output, const ConvertOptions& options,
                         parallel::RankFailure& failed, Reporter::Phase& phase, std::chrono::steady_clock::time_point t0);

// What a union would write (ucp-union --dry-run), from the format's plan alone: nothing is converted.
struct UnionCounts {
  size_t params = 0;
  uint64_t atomic_files = 0, bytes = 0;  // zero/<param>/<state>.pt and step.pt files; the source tensors' bytes
  std::string files;        // the folder's other files: "manifest.json", "manifest.json, zero/optimizer_state.pt"
  std::string atomic_note;  // said after the atomic file count ("" or " (zero/<param>/<state>.pt, step.pt)")
  std::string from;         // what the input is, before its path: "the checkpoint", "the DCP checkpoint", ...
  std::string input_kind;   // the --json field: "native", "work_folder", "dcp"
};

// An input format's ucp-union: its plan, then execute_union; and its --dry-run counts (may be empty).
// Registered by the format's union code under formats::detect's kind.format; returns true (for a
// namespace-scope initializer).
using UnionRunner = std::function<RunSummary(const std::string& input, const std::string& output, const ConvertOptions& options)>;
using UnionCounter = std::function<UnionCounts(const std::string& input, const ConvertOptions& options)>;
// `audits`: it writes ConvertOptions::audit (run_union refuses --audit for the others, and under mpirun).
// `engine_form`: with ConvertOptions::hf_engine_names it writes DeepSpeed engine model files (from_hf.h), so
// ucp-load --format deepspeed can take such an input.
bool register_union(const std::string& format, UnionRunner run, UnionCounter count = {}, bool audits = false,
                    bool engine_form = false);

// The counts of the union registered for `input`'s kind; UsageError naming the kind when none is.
UnionCounts count_union(const std::string& input, const ConvertOptions& options);

// Whether a union is registered for `format` (ucp-load converts such inputs through it first).
bool has_union(const std::string& format);
// Whether the union registered for `format` records --audit (ucp-load's check before converting).
bool union_audits(const std::string& format);
// Whether the union registered for `format` writes the DeepSpeed engine form (register_union's engine_form).
bool union_writes_engine_form(const std::string& format);

}  // namespace ucpkit::to_universal
