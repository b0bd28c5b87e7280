// pec-save: store all non-expert state and the selected experts of one checkpoint step into the
// store tiers, then commit the step (read -> plan -> execute -> commit -> garbage-collect).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "pec/checkpoint.h"
#include "core/reporter.h"

namespace ucpkit::pec {

struct SaveOptions {
  std::string checkpoint;
  std::string store;
  std::string fast_store;
  int64_t step = -1;  // -1: inferred from the checkpoint (pec/step_sources.h); else checked against it
  std::string policy = "sequential";
  int k = 0;
  uint64_t budget_bytes = 0;
  std::string tokens;  // a token-count file, or a folder of step<N>.{json,csv,jsonl} (pec/tokens.h)
  int k_snapshot = 0;
  int k_persist = 0;
  int keep = 2;       // durable tier: keep what restoring the latest `keep` steps needs
  int keep_fast = 1;  // fast tier retention
  int zstd_level = 0;  // 0: stored uncompressed (measured fastest on 2 cores; docs/pec.md)
  uint64_t chunk_bytes = 64ull << 20;
  bool bootstrap = true;  // the durable tier saves every expert it never saved (first save is full)
  bool plan_only = false;
  OpenOptions open;
  Reporter reporter;  // warnings (tools: tool::console_reporter())
};

// Throws UsageError for options that cannot work (K, tiers, policy without tokens, zstd level); called
// by pec_save and the watch loop before any store is created.
void check_save_options(const SaveOptions& options);

// Returns the JSON summary (on MPI rank 0; other ranks get an empty object), or the save plan when
// `plan_only`. `progress` is called with bytes done (rank-local). Path options may be relative (made
// absolute first, pec/paths.h). The step: `options.step` when it agrees with every step the checkpoint
// records (else UsageError naming both), or, when -1, the one they record ("step_inferred" and
// "step_from" in the summary and plan).
nlohmann::json pec_save(const SaveOptions& options, const std::function<void(uint64_t)>& progress = {},
                        uint64_t* total_bytes = nullptr);

}  // namespace ucpkit::pec
