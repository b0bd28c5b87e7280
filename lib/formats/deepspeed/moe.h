// Native DeepSpeed MoE rank topology (formats.md section 2): which EP rank and expert-data-parallel
// rank a DP rank is, and the local <-> global expert numbering inside parameter names.
#pragma once
#include <optional>
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
// Expert-group name "ep_size_<N>" -> N (param_groups.h ep_size_of_group_name; kept for its callers).
std::optional<int> ep_size_from_group_name(const std::string& group_name);

}  // namespace ucpkit::formats::deepspeed
