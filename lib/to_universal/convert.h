// The conversion drivers behind ucp-extract and ucp-union: plan, execute in parallel (TBB threads
// inside a process, parameters split by size across MPI ranks), write atomically, summarize.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/reporter.h"
#include "formats/universal/manifest.h"
#include "io/tensor.h"

namespace ucpkit::to_universal {

struct ConvertOptions {
  std::string patterns_file;          // --patterns
  int threads = 0;                    // --threads (0: all cores)
  double tolerance = 0;               // --tolerance for drifted TP replicas
  bool allow_unused_patterns = false; // --allow-unused-patterns
  bool overwrite = false;             // --overwrite an existing output folder
  bool sync = true;                   // flush the output to stable storage before renaming it (--no-sync: off)
  bool tag_latest = true;             // write latest_universal beside the output at all (ucp-diff's scratch
                                      // conversion: no, and no warning about it)
  bool tag_native_moe = false;        // ucp-union --tag-latest-universal: write latest_universal for a
                                      // native-MoE universal folder too (DeepSpeed's load_universal
                                      // loads the wrong experts from it; convert.cpp)
  // --audit FILE: the conversion's record of every parameter written (JSON, once the folder is in place), for
  // the inputs whose union registers that it writes one (union_executor.h register_union); "" = none.
  std::string audit;
  std::string audit_output;
  // A Hugging Face input: the universal folder in transformers' in-memory names and order with DeepSpeed
  // engine model files (from_hf.h run_union_hf_engine; ucp-load --format deepspeed), not Megatron-Core's.
  bool hf_engine_names = false;
  // With hf_engine_names: the optimizer param group's hyperparameters set over torch.optim.AdamW's defaults.
  nlohmann::json param_group = nlohmann::json::object();           // the output the audit names ("": the union's own; ucp-load: the user's)
  Reporter reporter;                  // warnings, details, progress (tools: tool::console_reporter())
};

struct RunSummary {
  std::string tool, output;
  size_t params = 0, files_written = 0;
  uint64_t bytes_read = 0, bytes_written = 0, peak_rss_bytes = 0;
  double seconds = 0;
  int ranks = 1, threads = 1;
  size_t buffers = 0;                    // model tensors without optimizer state carried (DCP sources)
  size_t items = 0;                      // a DCP's bytes entries carried verbatim (manifest "items")
  std::vector<std::string> not_carried;  // source entries left out (DCP: non-tensor items), said on stderr
  nlohmann::json to_json() const;
};

// A union's summary (ucp-union's --json): per-rank totals summed, time since `t0` and peak RSS the
// maximum over MPI ranks (collective).
RunSummary union_summary(const std::string& output, size_t params, int threads, uint64_t bytes_read,
                         uint64_t bytes_written, uint64_t files, std::chrono::steady_clock::time_point t0);

// The CRC-32 of `t`'s elements (manifest.json's crc32), taken from the data record of the torch file
// `path` the writer just wrote for it when that record holds exactly its bytes; computed otherwise.
uint32_t written_crc32(const std::string& path, const Tensor& t);

// Runs f(i) for every i of `mine` (this rank's parameters) on `threads` TBB threads, one parameter a
// task, checking for an interrupt before each and advancing `progress` after it.
void convert_each(const std::vector<size_t>& mine, int threads, Reporter::Bar& progress,
                  const std::function<void(size_t)>& f);

// Rank 0: the manifest entries every rank sent (mpi.gather of a JSON list of [index, entry] pairs),
// placed at their index among `count`.
std::vector<formats::universal::UniversalParam> gathered_entries(const std::vector<std::string>& gathered, size_t count);

// ucp-extract: checkpoint -> work folder (plan.json + fragments).
RunSummary run_extract(const std::string& checkpoint, const std::string& work_dir, const ConvertOptions& options);
// ucp-union: work folder or checkpoint (one-step mode) -> universal checkpoint folder.
RunSummary run_union(const std::string& input, const std::string& output, const ConvertOptions& options);

}  // namespace ucpkit::to_universal
