// Native DeepSpeed MoE rank topology (formats.md section 2): which EP rank and expert-data-parallel
// rank a DP rank is, and the local <-> global expert numbering inside parameter names.
#pragma once
#include <map>
#include <optional>
#include <set>
#include <string>

namespace ucpkit::formats::deepspeed {

struct EpCoords {
  int ep_rank = 0;   // which slice of the experts this rank holds
  int edp_rank = 0;  // its index in the expert-data-parallel group (the ZeRO partition of expert groups)
};

// TP = 1 topology: default ep_rank = d % EP, edp = d / EP; with use_data_before_expert_parallel_
// ep_rank = d / (DP/EP), edp = d % (DP/EP). Throws Error when EP does not divide DP.
EpCoords ep_coords(int dp_rank, int dp, int ep, bool data_before_expert);

// The local expert index j in "...deepspeed_experts.<j>...." (nullopt when not an expert name).
std::optional<int> local_expert_index(const std::string& name);
// Replaces the expert index in an expert parameter name.
std::string with_expert_index(const std::string& name, int index);
// The transformer layer index in "...layers.<i>...." (nullopt when absent).
std::optional<int> transformer_layer_index(const std::string& name);
// One native MoE layer as its expert files show it. Its id is DeepSpeed's moe_layer_id, the L of
// layer_L_expert_E_mp_rank_XX_model_states.pt: a counter over the MoE modules in named_modules order
// (v0.19.6 deepspeed/runtime/engine.py:4961-4965 _save_moe_checkpoint, file name :5009-5013 via
// _get_expert_ckpt_name :4244-4255). That, not the parameter names, says which MoE layer an expert is in.
struct ExpertFileLayer {
  std::string file;        // one of its expert files (for messages)
  std::set<int> named;     // the N of every "layers.N." in its parameter names
  bool unnamed = false;    // some parameter name has no "layers.N."
};
// The layer number a universal manifest records for each moe_layer_id (the key of `layers`): the
// transformer layer N where every MoE layer's expert names carry exactly one "layers.N." (Megatron's
// names; recorded as before), else the moe_layer_id itself (blocks.N, h.N, transformer.layer.N, ...).
// Either way the numbers rise with moe_layer_id, which is all readers use (their order). Throws Error
// naming both files when one MoE layer's files name two layers.N or the layers.N order disagrees
// with the moe_layer_id order.
std::map<int, int> expert_layer_numbers(const std::map<int, ExpertFileLayer>& layers);
// Expert-group name "ep_size_<N>" -> N (param_groups.h ep_size_of_group_name; kept for its callers).
std::optional<int> ep_size_from_group_name(const std::string& group_name);

}  // namespace ucpkit::formats::deepspeed
