// pec-save --watch: the persist agent of the two-level design (MoC-System section 5). Training writes
// full checkpoints quickly to a node-local folder (e.g. /dev/shm); the agent waits for each new
// global_step<N> to complete (DeepSpeed writes `latest` last, so a step is complete once `latest`
// names it), saves it into the store with the configured policy, removes snapshot folders older
// than the newest --keep-snapshots, logs one line per save, and on SIGTERM/SIGINT stops between
// saves (a save under way finishes its commit first; an interrupted one is never committed anyway).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "pec/save.h"

namespace ucpkit::pec {

struct WatchOptions {
  std::string dir;            // the training job's save folder
  double poll_seconds = 2.0;  // how often `latest` is read
  int keep_snapshots = 0;     // >0: keep only the newest N global_step folders in `dir` (after saving)
};

struct WatchResult {
  int saved = 0;   // steps saved
  int failed = 0;  // steps NOT saved (each logged with its error; not retried, but for a store whose lock
                   // another process holds: that step is tried again at the next poll)
};

// Runs until SIGTERM or SIGINT; returns the steps saved and failed (pec-save exits 1 when any failed).
// `log` gets one line per save or failed save, and a last line with both counts. Paths may be
// relative (pec/paths.h). Each step is saved with the step its checkpoint records (tag, global_steps
// and iteration must agree). Usage errors are thrown.
WatchResult watch_and_save(const SaveOptions& base, const WatchOptions& w, const std::function<void(const std::string&)>& log);

}  // namespace ucpkit::pec
