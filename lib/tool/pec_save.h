// pec-save: its options as the command line gives them, their one check, and the run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pec/save.h"
#include "pec/watch.h"
#include "tool/result.h"

namespace ucpkit::tool {

struct PecSaveOptions {
  // --input/--checkpoint, --output/--store, --policy, --k, --tokens, --fast-store, --k-snapshot,
  // --k-persist, --keep, --keep-fast, --zstd-level, --ep, --data-before-expert; check() fills the rest.
  pec::SaveOptions save;
  pec::WatchOptions watch;  // --watch, --poll-seconds, --keep-snapshots
  long long step = -1;      // -1: inferred from the checkpoint
  uint64_t budget = 0;      // --budget / --budget-bytes (0: none)
  uint64_t chunk = 64ull << 20;
  double bandwidth = 0, iteration_seconds = 0;
  bool plan = false, dry_run = false, no_bootstrap = false, verify = false;
  int threads = 0;
  std::vector<std::string> args;  // the command line, to name an option as typed

  // Every rule between options (exit 2, naming the option as typed), then `save` filled from them.
  void check();
};

// The persist agent (--watch: its lines on stdout as it goes, exit 1 when a step was not saved), the
// plan (--plan), the summary of what would be written (--dry-run) or the save; other MPI ranks than 0
// get an empty result.
Result run_pec_save(const PecSaveOptions& options);

}  // namespace ucpkit::tool
