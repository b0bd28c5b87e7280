// The ucp-load driver: universal checkpoint -> target layout (DeepSpeed files or safetensors),
// planned with UcpInfo, executed with TBB threads (and MPI ranks under mpirun), written atomically.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "load/ucp_info.h"

namespace ucpkit::load {

enum class OptimizerKind { Auto, Zero, Bf16 };

struct LoadOptions {
  std::string input, output;
  TargetLayout target;                   // bf16_optimizer is resolved from `optimizer`
  OptimizerKind optimizer = OptimizerKind::Auto;
  std::string format = "deepspeed";      // deepspeed | safetensors
  int threads = 0;                       // 0: all cores
  bool verify = true;                    // check atomic tensors against manifest checksums
  bool overwrite = false;
  int64_t vocab_multiple = 0;            // 0: from args / inferred from the source padding
  uint64_t shard_bytes = 5ull << 30;     // safetensors shard size limit
};

struct LoadSummary {
  std::string output, format;
  size_t params = 0, files_written = 0;
  uint64_t bytes_read = 0;      // atomic bytes copied into target files (each DP partition once)
  uint64_t bytes_verified = 0;  // atomic bytes read for checksum verification (each tensor once)
  uint64_t bytes_written = 0, peak_rss_bytes = 0;
  double seconds = 0;
  int ranks = 1, threads = 1;
  nlohmann::json to_json() const;
};

// Model description + target (optimizer flavour resolved) + plan, without writing anything.
struct Prepared {
  ModelInfo model;
  UcpInfo plan;
};
Prepared prepare(const LoadOptions& options);

// `ucp-load --plan`: the UcpInfo as JSON.
nlohmann::json plan_json(const LoadOptions& options);

// Writes the target checkpoint under options.output (built under a temporary name, then renamed).
LoadSummary run_load(const LoadOptions& options);

}  // namespace ucpkit::load
