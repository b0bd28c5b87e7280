// Where each expert's elements lie inside the flat ZeRO partitions of a DeepSpeed AutoEP checkpoint
// (docs/formats.md "AutoEP" and "AutoEP under ZeRO-3"; DeepSpeed tag v0.19.5). AutoEP fuses the
// experts of a layer into `<prefix>.w1/w2/w3` [E_local, ...] (moe/ep_experts.py:212-214), so a flat
// fragment of such a weight holds rows of several experts: these functions split a fragment into runs
// of one global expert each. Used by PEC (lib/pec) to cut the experts out of the optimizer shards.
// Pure: callers parse the files and map element runs to bytes.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// Elements [offset, offset + numel) of a fragment (offset relative to the fragment's first element)
// belong to global expert `global_expert`.
struct AutoEpExpertRun {
  int global_expert = 0;
  int64_t offset = 0;
  int64_t numel = 0;
};

// Splits elements [at, at + numel) of EP rank `ep_rank`'s fused weight [local_experts, ...]
// (`per_expert` elements per expert, row-major) into runs of one expert; global id = ep_rank *
// local_experts + local id (autoep_universal.py:333-338 concatenates the EP ranks along dim 0).
// Throws Error "<file>: ..." when the range lies outside the weight.
std::vector<AutoEpExpertRun> split_fused_expert_run(int64_t at, int64_t numel, int64_t per_expert, int local_experts,
                                                    int ep_rank, const std::string& file, const std::string& name);

// ---- ZeRO-1/2 (per-expert files + flat groups): the fused weights lie back to back in their
// group's flat buffer in param_shapes order; a rank's partition is `partition` elements of it.
struct AutoEpZero12Weight {
  int moe_layer = 0, local_experts = 0;
  int64_t offset = 0;      // first element of the weight in its group's flat buffer
  int64_t per_expert = 0;  // elements of one expert's slice
};
struct AutoEpZero12Slicing {
  std::map<std::string, AutoEpZero12Weight> weights;  // "<prefix>.w1" -> where it lies
  bool data_before_expert = false;                    // ds_config use_data_before_expert_parallelism
  bool empty() const { return weights.empty(); }
};
// From the mp_rank model-states dict: ds_autoep_layers (None or absent: empty), param_shapes (every
// expert weight must be listed as [num_local_experts, ...]) and ds_config. Throws Error "<file>: ...".
AutoEpZero12Slicing autoep_zero12_slicing(const pickle::ValuePtr& model_states, const std::string& file);
// Runs of one param_slice_mappings fragment (`start` in the partition, `numel` elements) of the weight
// `w`, on the rank with EP rank `ep_rank` and expert-DP rank `edp_rank`; `partition` = elements of one
// partition of the group (fp32 partition + its padding).
std::vector<AutoEpExpertRun> autoep_zero12_fragment_runs(const AutoEpZero12Weight& w, int ep_rank, int edp_rank,
                                                         int64_t partition, int64_t start, int64_t numel,
                                                         const std::string& file, const std::string& name);

// ---- ZeRO-3 (partition-native, 'zero3_partitioned'): every fused weight [E_local, ...] is split on
// its own into ceil(n / count) slices over the expert-DP group (stage3.py:833-880; the rank's
// partition_rank from ds_zero_partition_groups), padding at the end. `part` = ep_rank * count +
// partition_rank (the join order of ds_to_universal.py:654-707, to_universal::SourceFragment::part); `numel` the
// fragment's elements without padding. Runs are relative to the fragment's first element.
std::vector<AutoEpExpertRun> autoep_zero3_fragment_runs(const std::vector<int64_t>& local_shape, int count, int part,
                                                        int64_t numel, const std::string& file, const std::string& name);

}  // namespace ucpkit::formats::deepspeed
