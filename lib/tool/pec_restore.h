// pec-restore: its options as the command line gives them, their one check, and the run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pec/restore.h"
#include "tool/result.h"

namespace ucpkit::tool {

struct PecRestoreOptions {
  // --input/--store, --fast-store, --output, --tokens, --plt-threshold, --capacity-factor,
  // --ds-version, --overwrite/--force; check() fills the rest.
  pec::RestoreOptions restore;
  long long step = -1;          // -1: the latest committed step
  uint64_t memory = 256 << 20;  // --memory / --memory-mb, whole MiB
  std::string report;           // --report: the restore report is written here
  bool plan = false, dry_run = false;
  int threads = 0;
  std::vector<std::string> args;  // the command line, to name an option as typed

  // Every rule between options (exit 2, naming the option as typed), then `restore` filled from them.
  void check();
};

// The plan (--plan), the summary of what would be written (--dry-run) or the restore (and its
// --report file); other MPI ranks than 0 get an empty result.
Result run_pec_restore(const PecRestoreOptions& options);

}  // namespace ucpkit::tool
