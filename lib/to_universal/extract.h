// Extract (the map phase): reads a DeepSpeed / Megatron-DeepSpeed checkpoint's metadata and plans
// which fragments of which shard files make up each parameter; optionally materializes the
// fragments into a work folder for a separate ucp-union run.
#pragma once
#include <string>

#include "to_universal/plan.h"
#include "core/reporter.h"
#include "io/torch/torch_file.h"

namespace ucpkit::to_universal {

struct ExtractOptions {
  std::string patterns_file;  // overrides universal_checkpoint_info when given
  int threads = 0;            // 0: all cores
  TorchLoadOptions open;      // how every file read for the plan is opened (its CRC check)
};

// Builds the plan straight from the checkpoint (no data read beyond the pickles).
ExtractPlan plan_checkpoint(const std::string& checkpoint, const ExtractOptions& options);

struct ExtractStats {
  uint64_t bytes_read = 0, bytes_written = 0, fragments = 0;
  uint64_t files = 0;  // every file of the work folder: fragments, model files, optimizer_state.pt, plan.json
};

// Writes `plan`'s fragments as work_dir/fragments/<param>/tp<T>.part<D>.pt (dict state -> 1-D
// tensor, plus "step"), copies of the model files, the common optimizer state, and plan.json
// pointing at them. The folder appears only when complete (built beside it, then renamed; with
// `sync`, flushed to stable storage first).
ExtractStats write_work_folder(const ExtractPlan& plan, const std::string& work_dir, int threads, bool sync = true,
                               bool overwrite = false, const Reporter& reporter = {});

ExtractPlan load_work_plan(const std::string& work_dir);

}  // namespace ucpkit::to_universal
