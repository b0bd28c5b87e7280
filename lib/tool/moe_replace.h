// moe-replace: its options as the command line gives them, their one check, and its run.
#pragma once
#include <cstdint>
#include <string>

#include "placement/planner.h"
#include "tool/result.h"

namespace ucpkit::tool {

struct MoeReplaceOptions {
  placement::PlanRequest req;  // what the planner takes (--loads, sizes, --algorithm, --current, --previous, ...)
  std::string output, svg, sglang_out, vllm_out;  // --output, --svg, --sglang-expert-location, --vllm-eplb-state
  std::string failed;                             // --failed-nodes "3,7"
  std::string layers_map;                         // --layers-map
  std::string min_recovery;                       // --min-recovery k:p
  int pp_size = 0;                                // --pp-size
  std::string pp_partition;                       // --pp-layer-partition "a,b,c"
  int added = 0;                                  // --added-nodes
  double exact_limit = 1e6;                       // --exact-limit
  uint64_t expert_bytes = 0, max_moved_bytes = 0;  // --expert-bytes, --max-moved-bytes
  bool expert_bytes_given = false, max_moved_given = false, weight_given = false, current_given = false;
  int threads = 0;
  bool dry_run = false, overwrite = false;

  // Every rule between options (exit 2 naming the option as typed): no output replaces the loads or
  // the plan, --max-failures, node ids and the layers map parsed; fills `req` with what they give.
  void check();
};

// Plans, then writes every output all or nothing (each checked and staged before the first rename,
// each fsynced); with --dry-run writes nothing. The result: the envelope's summary, or the table.
Result run_moe_replace(const MoeReplaceOptions& options);

}  // namespace ucpkit::tool
