// One DeepSpeed `*_optim_states.pt` of any flavour (ZeRO-1/2, BF16_Optimizer, ZeRO-3 with AutoEP
// partition groups) as a typed model: the only code that knows the keys of its
// `optimizer_state_dict`. Fields are named as DeepSpeed names them. Read, the tensors are zero-copy
// views into the file; written, they may be generated storages (the writer streams them).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "formats/deepspeed/autoep.h"
#include "io/pickle/value.h"
#include "io/tensor.h"

namespace ucpkit {
struct TorchFile;
}

namespace ucpkit::formats::deepspeed {

struct OptimizerShard {
  // Zero12: DeepSpeedZeroOptimizer.state_dict (stage_1_and_2.py `_rigid_state_dict`);
  // Bf16Optimizer: BF16_Optimizer.state_dict (bf16_optimizer.py), the same flat groups without loss
  // scaling and zero_stage; Zero3: DeepSpeedZeroOptimizer_Stage3 (stage3.py `_rigid_state_dict`).
  enum class Flavor { Zero12, Bf16Optimizer, Zero3 };
  // A param_slice_mappings entry: the parameter's run [start, start + numel) of the flat partition.
  struct Fragment {
    std::string param;
    int64_t start = 0, numel = 0;
  };
  // One flat group (ZeRO-1/2, BF16_Optimizer) or sub-group (ZeRO-3).
  struct Group {
    std::vector<Fragment> fragments;  // param_slice_mappings[g] in buffer order (ZeRO-3: none)
    Tensor fp32;                      // single_partition_of_fp32_groups[g] / fp32_flat_groups[g]
    bool has_state = false;           // the optimizer's state[g] exists (not before the first step)
    pickle::ValuePtr step;            // state[g]["step"] (an int or a tensor); null when absent
    std::vector<std::pair<std::string, Tensor>> moments;  // the other tensors of state[g] (exp_avg, ...), in order
    int64_t padding = -1;             // group_paddings[g]; -1: not recorded
    int partition_count = -1;         // partition_count[g] (ZeRO-1/2); -1: not recorded
    bool moe = false;                 // ZeRO-1/2: param_groups[g] is an expert group ("moe": True)
    int ep_size = 0;                  // ZeRO-1/2: N of param_groups[g]'s name "ep_size_<N>"; 0: no such name
  };
  Flavor flavor = Flavor::Zero12;
  std::vector<Group> groups;
  // The torch optimizer's param_groups as saved (hyper-parameters, "params"). ZeRO-1/2: one per flat
  // group; ZeRO-3: one per optimizer param group, "params" listing its sub-groups.
  std::vector<pickle::ValuePtr> param_groups;
  // base_optimizer_state saved as a list of per-group states (elastic checkpoint,
  // stage_1_and_2.py `_get_base_optimizer_state`) instead of torch's {state, param_groups}.
  bool elastic = false;
  int partition_count = -1;  // ZeRO-3: the one partition_count stage3.py saves (its DP world size); -1: absent
  pickle::ValuePtr base_optimizer_state_step;  // elastic only: param_groups[0]["step"] when the optimizer keeps one
  // Values DeepSpeed pickles as Python objects, kept as saved (null: the key is absent).
  pickle::ValuePtr zero_stage;   // ZeroStageEnum
  pickle::ValuePtr loss_scaler;  // LossScaler / DynamicLossScaler
  pickle::ValuePtr dynamic_loss_scale, overflow, clip_grad;
  pickle::ValuePtr ds_version;   // ZeRO-1/2 and BF16_Optimizer record it inside the dict too
  // ds_zero_partition_groups (AutoEP under ZeRO-3, stage3.py v0.19.5:3117-3144; parsed by autoep.h):
  // one per sub-group, empty when absent. `expert_group_name` is the group name its expert entries record.
  std::vector<Zero3PartitionGroup> partition_groups;
  std::string expert_group_name;

  bool zero3() const { return flavor == Flavor::Zero3; }
};

// The shard of a loaded `*_optim_states.pt` (its root dict). Every error names `path` and the key.
OptimizerShard read_optimizer_shard(const pickle::ValuePtr& root, const std::string& path);
OptimizerShard read_optimizer_shard(const TorchFile& file);

// ds_to_universal.py `_save_optimizer_state` (sharded_states): the optimizer_state_dict keys that hold
// one rank's partition (base_optimizer_state, param_slice_mappings, single_partition_of_fp32_groups),
// left out of the universal zero/optimizer_state.pt; the other keys are the same on every rank.
bool is_sharded_state(std::string_view key);
// The torch optimizer's param_groups list object as saved in `optimizer_state_dict` (ZeRO-1/2 and
// BF16_Optimizer: base_optimizer_state's, ZeRO-3: the inner optimizer_state_dict's); null when absent.
// The object itself, not a copy: a pickle that also holds the dict references it once.
pickle::ValuePtr saved_param_groups(const pickle::ValuePtr& optimizer_state_dict);

// ZeRO-3: param_groups[g]["params"] lists the sub-groups of optimizer param group g (the optimizer's
// state numbering of the fp32 sub-group partitions, stage3.py `_set_fp32_optimizer_param_groups`).
// Returns the group of each of `sub_groups` sub-groups; throws Error naming `path` when a sub-group is
// in no group, in two, or out of range.
std::vector<int> zero3_sub_group_owners(const std::vector<pickle::ValuePtr>& param_groups, size_t sub_groups,
                                        const std::string& path);

// The `optimizer_state_dict` value DeepSpeed saves for `shard`, keys in DeepSpeed's order. Tensors are
// referenced, not copied (generated storages stay generated).
pickle::ValuePtr to_pickle(const OptimizerShard& shard);

// The *_optim_states.pt file root as engine.py _save_zero_checkpoint writes it:
// {optimizer_state_dict, ds_config, ds_version}.
pickle::ValuePtr optimizer_file_root(pickle::ValuePtr optimizer_state_dict, pickle::ValuePtr ds_config,
                                     pickle::ValuePtr ds_version);
// Native MoE: the expert/data rank order a shard file's ds_config records (`file_root`: the loaded
// *_optim_states.pt): the config key use_data_before_expert_parallelism (runtime/constants.py
// USE_DATA_BEFORE_EXPERT_PARALLEL) or use_data_before_expert_parallel_, the engine's attribute name,
// which earlier ucpkit fixtures wrote; nullopt when neither holds a boolean.
std::optional<bool> shard_data_before_expert(const pickle::ValuePtr& file_root);

// Raw-root accessors for code that carries values over without reading the whole shard (the key names
// stay here): the value under DeepSpeed's key, or null when absent.
pickle::ValuePtr raw_optimizer_state_dict(const pickle::ValuePtr& file_root);
pickle::ValuePtr raw_loss_scaler(const pickle::ValuePtr& optimizer_state_dict);
pickle::ValuePtr raw_clip_grad(const pickle::ValuePtr& optimizer_state_dict);
pickle::ValuePtr raw_overflow(const pickle::ValuePtr& optimizer_state_dict);

}  // namespace ucpkit::formats::deepspeed
