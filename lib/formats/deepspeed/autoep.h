// DeepSpeed AutoEP (DeepSpeed >= 0.19.2, module_inject/auto_ep_layer.py) checkpoint format: the
// `ds_autoep_layers` list of the model files, the per-expert file names and keys (ZeRO-1/2), the
// ZeRO-3 shards' `ds_zero_partition_groups` and expert-DP partition ranks (ZeRO-3), the
// fused expert parameter names, and the universal form of an expert parameter that
// deepspeed/checkpoint/autoep_universal.py writes. docs/formats.md "AutoEP" has the facts with
// DeepSpeed file:line (tag v0.19.5). Readers describe what they found; no file I/O here.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// One entry of `ds_autoep_layers` (engine.py:4986-5017).
struct AutoEpLayer {
  int moe_layer_id = 0;           // layer_<moe_layer_id>_expert_<g>_... files
  std::string module_path;        // "model.layers.3.mlp"
  int num_experts = 0;            // E (global)
  int num_local_experts = 0;      // E / ep_size
  int ep_size = 0;
  std::string expert_key_prefix;  // "<module_path>.experts": parameters <prefix>.w1, .w2, .w3
  std::string checkpoint_format;  // "per_expert_files" (ZeRO-0/1/2) or "zero3_partitioned"
  // The saving rank's place (engine.py:5004-5016); -1 when not recorded.
  int checkpoint_format_version = -1;  // 1 under ZeRO-3 (checkpoint/constants.py AUTOEP_ZERO3_...)
  int ep_rank = -1, expert_data_parallel_rank = -1, expert_data_parallel_world_size = -1;
  int global_expert_start = -1, global_expert_end = -1;
  bool zero3_partitioned() const { return checkpoint_format == "zero3_partitioned"; }
};

// The fused expert weights of every AutoEP layer (autoep_universal.py:249-253).
const std::vector<std::string>& autoep_weight_names();  // {"w1", "w2", "w3"}

// Parses and validates `ds_autoep_layers` as autoep_universal.py:214-255 does (non-empty list of dicts
// with expert_key_prefix, num_experts, num_local_experts, ep_size; positive ints; num_experts =
// num_local_experts * ep_size; unique prefixes and moe_layer_ids). Throws Error "<file>: ..." otherwise.
std::vector<AutoEpLayer> parse_autoep_layers(const pickle::ValuePtr& v, const std::string& file);

// AutoEP under ZeRO-3 (partition-native, engine.py:4998-5003): every entry must be
// 'zero3_partitioned', format version 1, with ep_rank, expert_data_parallel_rank/world_size and the
// global expert range [ep_rank*E_local, +E_local), as checkpoint/autoep_zero3_metadata.py:69-94
// validates it. Throws Error "<file>: ..." otherwise.
void check_autoep_zero3_layers(const std::vector<AutoEpLayer>& layers, const std::string& file);

// One entry of a ZeRO-3 optimizer shard's `ds_zero_partition_groups` (stage3.py:3117-3144, written
// only when a sub-group holds AutoEP experts): how that sub-group is partitioned.
struct Zero3PartitionGroup {
  int partition_count = -1;
  int partition_rank = -1;
  std::vector<int> partition_ranks;  // global ranks of the sub-group's process group
  bool autoep_expert = false;        // families == ['autoep_expert']
};
// The list, one entry per sub-group in order; empty when the shard has none. Throws Error on a
// malformed entry.
std::vector<Zero3PartitionGroup> parse_zero3_partition_groups(const pickle::ValuePtr& optimizer_state_dict,
                                                              const std::string& file);
// The `ds_zero_partition_groups` list a ZeRO-3 AutoEP rank saves (stage3.py:3117-3133), one dict per
// sub-group in order with keys sub_group, partition_count, partition_rank, partition_ranks, families,
// group_names: families ['autoep_expert'] and group_names [<ep_group_name>] for an expert sub-group
// (auto_ep_layer.py:480-484), ['replicated'] / ['replicated'] otherwise (engine.py:1882-1915).
pickle::ValuePtr zero3_partition_groups_value(const std::vector<Zero3PartitionGroup>& groups,
                                              const std::string& ep_group_name);
// Global ranks of the ZeRO-3 partition group of EP rank `ep_rank`'s experts, in partition-rank order:
// the expert-data-parallel group (engine.py:1882-1890, utils/groups.py:304); TP = PP = 1.
std::vector<int> autoep_expert_dp_ranks(int ep_rank, int dp, int ep, bool data_before_expert);
// "ep_size_<EP>": AutoEP's expert-parallel group name; forwards to param_groups.h expert_group_name
// (left for deepspeed_writer.cpp's zero3_state until it calls that).
std::string autoep_group_name(int ep);

// Its per-expert files are named by file_names.h expert_states_name (engine.py:4190-4200).
// Key of expert `global_expert` of `<prefix>.<w>` inside its per-expert file (engine.py:5037-5040).
std::string autoep_expert_file_key(const std::string& prefix, const std::string& weight, int global_expert);

// One per-expert file layer_<id>_expert_<g>_mp_rank_00_model_states.pt of AutoEP layer `a` under
// ZeRO-1/2 (engine.py:5029-5054), its loaded root: exactly the keys <prefix>.w1/w2/w3.<g> (g =
// `global_expert`), each a tensor of its fused weight's shape without the expert dimension (`fused`:
// "w1" -> the fused weight's [num_local_experts, ...] as param_shapes gives it). Folded AutoEP+AutoTP
// shards (a "folding" key) are refused (autoep_universal.py:201-207). Throws Error naming `path`.
void check_autoep_expert_file(const pickle::ValuePtr& root, const std::string& path, const AutoEpLayer& a,
                              int global_expert, const std::map<std::string, std::vector<int64_t>>& fused);

// The universal state file of an AutoEP expert parameter (autoep_universal.py:333-338):
// {'param': [E, ...], 'cat_dim': 0, 'is_expert_param': True, 'ep_num_experts': E}, written by
// formats/universal/state_file.h.
pickle::ValuePtr autoep_universal_state(const pickle::ValuePtr& param, int num_experts);

// Rewrites a saved `ds_autoep_layers` list (top level or inside universal_checkpoint_info) for a
// target EP size and DP size, as rank 0 of that job records it (engine.py:4986-5017): ep_size,
// num_local_experts, ep_group_name, ep_rank 0, expert_data_parallel_rank 0,
// expert_data_parallel_world_size, global_expert_start 0, global_expert_end, and the format of the
// target's ZeRO stage (checkpoint_format 'zero3_partitioned' / version 1 under ZeRO-3, else
// 'per_expert_files' / None, :4998-5003). No-op on None. Under ZeRO-3 every DP rank writes its own
// model file (engine.py:5090) with its own place: `ep_rank` and `edp_rank` set ep_rank,
// expert_data_parallel_rank and the global expert range [ep_rank * E_local, +E_local) (:5004-5016).
void retarget_autoep_layers(const pickle::ValuePtr& layers, int ep, int dp, bool zero3, int ep_rank = 0,
                            int edp_rank = 0);

// ds_config key naming the expert/data rank order (runtime/constants.py:518; ds_to_universal.py:877).
inline constexpr const char* kUseDataBeforeExpertParallelism = "use_data_before_expert_parallelism";

}  // namespace ucpkit::formats::deepspeed
