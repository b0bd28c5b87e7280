// pec-restore: rebuild a complete checkpoint from the store tiers (latest non-expert state plus each
// expert's newest intact copy in any tier), and the report: restored step per expert, lost tokens,
// PLT, dynamic K and the capacity plan. Read (manifests) -> plan (restore_plan.h) -> execute (streamed
// into a temporary step folder, restore_writer.h) -> report -> commit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/reporter.h"
#include "pec/restore_plan.h"

namespace ucpkit::pec {

struct RestoreOptions {
  std::string store;
  std::string fast_store;
  std::string output;
  int64_t step = -1;  // -1: latest committed
  std::string tokens;  // per-interval token counts when the store has none
  double plt_threshold = 0.0375;
  double capacity_factor = 1.1;
  bool force = false;  // replace an existing global_step<N> under --output
  uint64_t memory_mb = 256;  // budget for the streaming writer's buffers (peak RSS stays near it)
  std::string ds_version;  // native MoE: DeepSpeed version line to write ("" = the saved checkpoint's)
  Reporter reporter;       // warnings, progress (tools: tool::console_reporter())
};

struct RestoreResult {
  nlohmann::json report;         // the --report document
  std::vector<std::string> warnings;
  std::string output_dir;        // the step folder written
  uint64_t bytes_written = 0;
  double seconds = 0;
};

// Reads the store manifests, plans (restore_plan.h), executes the plan, reports, commits.
RestoreResult pec_restore(const RestoreOptions& options);
// The plan pec_restore would execute with these options (`pec-restore --plan`): read from the store
// manifests under a shared lock, refused as the restore would refuse; nothing is written.
RestorePlan pec_restore_plan(const RestoreOptions& options);
// Plain-text table of a report (one line per expert that lost tokens or came from an older step).
std::string report_table(const nlohmann::json& report);

}  // namespace ucpkit::pec
