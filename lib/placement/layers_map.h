// Which decoder layers of the model are MoE layers. The engines disagree on the
// layer axis of a placement: SGLang's --init-expert-location has one row per decoder layer, dense
// layers included (61 for DeepSeek-V3), vLLM's EPLB state one row per MoE layer (58). A plan has one
// row per MoE layer; with a layers map one run writes both engines' files with their own shapes.
// Sources (file:line): docs/moe-replace.md, section "Engine files".
#pragma once
#include <string>
#include <vector>

#include "placement/loads.h"

namespace ucpkit::placement {

struct LayersMap {
  int decoder_layers = 0;
  std::vector<int> moe_layers;  // decoder layer ids, ascending
};

// `spec` is "D:a-b[,c-d|,c...]" (D decoder layers; the MoE layers as ids or ranges, e.g. 61:3-60) or
// the path of a Hugging Face config.json: num_hidden_layers, and the MoE layers by the model's rule
// (DeepSeek V2/V3: n_routed_experts, first_k_dense_replace, moe_layer_freq; Qwen2/3-MoE: num_experts,
// decoder_sparse_step, mlp_only_layers; Mixtral: num_local_experts, every layer). Throws UsageError
// naming --layers-map for a bad spec, Error naming the file for an unreadable or unknown config.
LayersMap parse_layers_map(const std::string& spec);

// Loads with one row per decoder layer become one row per MoE layer (the dense rows dropped; an
// engine dump such as SGLang's has zeros there); loads with one row per MoE layer stay. Anything else
// throws Error naming the loads file and the map.
LoadMatrix moe_rows(const LoadMatrix& loads, const LayersMap& map, const std::string& loads_name);

// One pipeline stage's share of the model: decoder layers [first_layer, end_layer) (SGLang's rows of
// --init-expert-location for the stage are these decoder layers, dense ones included) and the MoE
// layers among them, which are the plan's rows [first_moe_row, end_moe_row) (vLLM's EPLB state of
// the stage has one row per MoE layer it holds).
struct PpStage {
  int stage = 0;
  int first_layer = 0, end_layer = 0;
  std::vector<int> moe_layers;  // decoder layer ids
  int first_moe_row = 0, end_moe_row = 0;
};

// The split of vLLM's and SGLang's get_pp_indices (vllm/distributed/utils.py, SGLang's
// srt/distributed/utils.py): `partition` (their VLLM_PP_LAYER_PARTITION / SGLANG_PP_LAYER_PARTITION:
// layers per stage, summing to the decoder layers) when given, else decoder_layers / pp_size each with
// the remainder one layer each to stages pp_size-2, pp_size-3, ... (the last stage, which also runs the
// final norm and LM head, gets none). Throws UsageError naming --pp-size / --pp-layer-partition when
// pp_size is not 1..decoder layers or the partition does not have pp_size positive sizes summing to them.
std::vector<PpStage> pp_stages(const LayersMap& map, int pp_size, const std::vector<int>& partition = {});
// "a,b,..." (--pp-layer-partition): positive layer counts. Throws UsageError otherwise.
std::vector<int> parse_pp_partition(const std::string& text);

}  // namespace ucpkit::placement
