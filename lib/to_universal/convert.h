// The conversion drivers behind ucp-extract and ucp-union: plan, execute in parallel (TBB threads
// inside a process, parameters split by size across MPI ranks), write atomically, summarize.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/reporter.h"

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
  Reporter reporter;                  // warnings, details, progress (tools: tool::console_reporter())
};

struct RunSummary {
  std::string tool, output;
  size_t params = 0, files_written = 0;
  uint64_t bytes_read = 0, bytes_written = 0, peak_rss_bytes = 0;
  double seconds = 0;
  int ranks = 1, threads = 1;
  nlohmann::json to_json() const;
};

// ucp-extract: checkpoint -> work folder (plan.json + fragments).
RunSummary run_extract(const std::string& checkpoint, const std::string& work_dir, const ConvertOptions& options);
// ucp-union: work folder or checkpoint (one-step mode) -> universal checkpoint folder.
RunSummary run_union(const std::string& input, const std::string& output, const ConvertOptions& options);

}  // namespace ucpkit::to_universal
