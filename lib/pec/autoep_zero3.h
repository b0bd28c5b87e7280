// DeepSpeed AutoEP under ZeRO-3 (partition-native, 'zero3_partitioned'; docs/formats.md "AutoEP under
// ZeRO-3", docs/pec.md): no expert files; every expert lives only inside each DP rank's ZeRO-3 flat
// sub-group partitions of the [bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt shards (fp32_flat_groups
// and every optimizer tensor state of the sub-group: exp_avg, exp_avg_sq). The partition layout comes
// from each DP rank's param_shapes and its shard's ds_zero_partition_groups (formats::deepspeed::
// OptimizerShard), checked against its ds_autoep_layers; formats::deepspeed::autoep_zero3_fragment_runs
// splits each slice per expert; this file maps the runs to byte ranges of the shards' zip records.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "pec/checkpoint.h"

namespace ucpkit::pec {

// True when `zero3_model_file` (a zero_pp_rank_D_mp_rank_XX_model_states.pt) carries AutoEP layers.
bool is_autoep_zero3(const std::string& zero3_model_file);

struct AutoEpZero3Experts {
  std::vector<int> experts_per_layer;  // by moe_layer_id
  int ep_size = 1;
  // optimizer shard (file name inside the step folder) -> (moe layer, global expert) -> byte ranges
  std::map<std::string, std::map<std::pair<int, int>, std::vector<ByteRange>>> ranges;
};

// Every expert's byte ranges in every optimizer shard of the step folder `step_dir`. Throws Error
// naming the file on a layout that does not fit (ranks that disagree, a partition claimed twice or
// missing), and for legacy (non-zip) shards.
AutoEpZero3Experts autoep_zero3_experts(const std::string& step_dir);

}  // namespace ucpkit::pec
