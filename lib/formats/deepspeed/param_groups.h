// Megatron-DeepSpeed's optimizer parameter groups: which parameters get weight decay, and the name
// DeepSpeed gives an expert group ("ep_size_<N>"). The one spelling of both; pure functions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// Megatron's get_param_groups (microsoft/Megatron-DeepSpeed megatron/optimizer/__init__.py:39-40 at
// f4157be; NVIDIA/Megatron-LM's megatron/core/optimizer/__init__.py _get_param_groups has the same
// default no_weight_decay_cond):
//   no_wd = name.endswith(".bias") or len(param.shape) == 1
// so a 2-D ".bias" gets no weight decay, and a 0-D parameter does get it.
bool megatron_weight_decay(const std::string& name, const std::vector<int64_t>& shape);

// Which of a model's two Megatron groups a parameter is in: 0 = weight decay (wd_no_scale_lr,
// created first), 1 = no weight decay (no_wd_no_scale_lr), megatron/optimizer/__init__.py:57-62.
int megatron_group_slot(const std::string& name, const std::vector<int64_t>& shape);

// "ep_size_<ep>": an expert parameter's group_name (deepspeed/moe/layer.py:61 at v0.19.5-27), which
// split_params_into_different_moe_groups_for_optimizer makes the expert param group's 'name'
// (deepspeed/moe/utils.py:102-105). AutoEP uses the same name (deepspeed/runtime/engine.py).
std::string expert_group_name(int ep);
// The EP size an optimizer param group's name carries ("ep_size_4" -> 4; a name that contains
// ep_size_<N> anywhere, as older Megatron-DeepSpeed prefixed it), nullopt when none.
std::optional<int> ep_size_of_group_name(const std::string& group_name);

// A saved param_groups entry (as JSON) without what depends on the layout rather than on the run: its
// 'params' (indices into this layout's partition) and the EP size in an expert group's name ("ep_size_4"
// -> "ep_size_<EP>"): one run saved at two layouts has equal settings (ucp-diff compares these).
nlohmann::json layout_free_group(nlohmann::json group);

// One entry of a saved optimizer's param_groups (torch Optimizer.state_dict: the group's keys, 'params'
// replaced by indices), as far as group membership needs it.
struct SavedParamGroup {
  bool moe = false;           // 'moe': True: an expert group (moe/utils.py v0.19.6 :101-108, is_moe_param_group :151-152)
  std::string name;           // 'name' ("" when absent): 'parameters' (the MoE tutorial), 'ep_size_<N>' (experts), ...
  double weight_decay = 0.0;  // 'weight_decay' (0 when absent)
};
// The entries of a param_groups list in order; an entry that is not a dict reads as a default group.
std::vector<SavedParamGroup> saved_param_groups(const std::vector<pickle::ValuePtr>& groups);

// An optimizer param_groups entry of an expert group ('moe': True) that carries a 'name' gets `name`
// (a target's ep_size_<N>); any other entry is left as it is.
void rename_expert_group(const pickle::ValuePtr& group, const std::string& name);

// The expert param group split_params_into_different_moe_groups_for_optimizer makes of `dense` (moe/utils.py:90-115 at
// v0.19.5-27): a copy of its hyper-parameters with 'moe' True, 'name' expert_group_name(ep) and 'params' [index].
pickle::ValuePtr expert_param_group(const pickle::ValuePtr& dense, int ep, int64_t index);

// Whether a model-states root was saved by Megatron's training script: Megatron-DeepSpeed's
// save_checkpoint puts its argparse Namespace under 'args' (megatron/checkpointing.py:254-281 at
// 4efb479d: state_dict['args'] = args, with num_layers) and nests the module as
// {'language_model': ...} (gpt_model.py:266-283). Only then do Megatron's group rules apply.
bool saved_by_megatron(const pickle::ValuePtr& model_states_root);

}  // namespace ucpkit::formats::deepspeed
