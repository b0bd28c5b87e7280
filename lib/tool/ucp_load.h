// ucp-load: its options as the command line gives them, their one check, and the run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "reshard/load.h"
#include "tool/result.h"

namespace ucpkit::tool {

struct UcpLoadOptions {
  // --input, --output, --verify-against, --reuse-output, --ds-version, --threads, --overwrite,
  // --no-sync, --vocab-multiple, --sub-group-size; check() fills the rest from the fields below.
  reshard::LoadOptions load;
  std::string dtype = "bf16", device = "cpu", optimizer = "auto", exchange = "auto";
  std::string param_group;  // --param-group: JSON object ("": AdamW's defaults); a Hugging Face input, --format deepspeed
  std::string hf_experts;  // --hf-experts: "" (not given: per expert), "per-expert" or "fused"
  std::string to_names;    // --to-names: "" / "transformers" (a Hugging Face input's engine form) or "megatron-deepspeed"
  std::string format{reshard::output_format_name(reshard::OutputFormat::DeepSpeed)};
  std::string partition_method;  // --partition-method ("": see reshard::TargetLayout::partition_method)
  std::string layer_types;       // --layer-types FILE ("": not given; reshard::TargetLayout::layer_types)
  int tp = 1, pp = 1, dp = 1, zero_stage = 1, ep = 1;
  int etp = 0;  // --etp (0: not given)
  int pp_rank = 0, tp_rank = 0, dp_rank = 0;  // --device cuda: the rank materialized
  int64_t world_size = 0;                     // --world-size (0: not given)
  uint64_t shard_size = 5000000000, batch = 256 << 20;
  bool plan = false, verify = true, dry_run = false;
  // Which of --tp, --pp, --dp, --zero-stage, --ep, --dtype the command line gave (the others are
  // the source's); world_size is taken from the field above.
  reshard::TargetGiven given;
  std::vector<std::string> args;  // the command line, to name an option as typed

  // Every rule between options (exit 2, naming the option as typed), then `load` filled from them.
  // Without --plan or --dry-run it also reads whether --input is a universal checkpoint (--device cuda
  // and --verify-against depend on it).
  void check();
};

// The plan (--plan), the summary of what would be written (--dry-run), the partition on the GPU
// (--device cuda) or the conversion; other MPI ranks than 0 get an empty result (but --device cuda).
Result run_ucp_load(const UcpLoadOptions& options);

}  // namespace ucpkit::tool
