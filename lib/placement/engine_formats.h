// Plans in the files inference engines load (SGLang --init-expert-location, vLLM's EPLB state),
// and their expert-load dumps as loads. Source file:line for every fact: docs/moe-replace.md.
#pragma once
#include <string>

#include "placement/layers_map.h"
#include "placement/loads.h"
#include "placement/plan.h"

namespace ucpkit::placement {

// SGLang --init-expert-location JSON: {"physical_to_logical_map": [[...] per layer]}, nothing else
// (SGLang passes the dict as keyword arguments to ExpertLocationMetadata.init_by_mapping, so any
// other key is a TypeError there). SGLang's physical expert p lives on GPU p // (slots per GPU),
// our slot numbering; start SGLang with --ep-size = GPUs and --ep-num-redundant-experts = slots - experts.
// With a layers map (layers_map.h) the file has one row per decoder layer, as SGLang sizes it
// (num_layers = the model's num_hidden_layers); a dense layer's row is SGLang's own trivial mapping
// (physical p -> logical p % experts, ExpertLocationMetadata.init_trivial), which no token uses.
std::string sglang_expert_location_json(const Plan& plan, const LayersMap* map = nullptr);

// vLLM EplbModelState tensors as safetensors (int64, as vLLM builds them):
// physical_to_logical_map [layers, slots], logical_to_physical_map [layers, experts,
// num_redundant_experts + 1] padded with -1 (physical ids ascending, as EplbState.add_model fills
// them), logical_replica_count [layers, experts].
std::string vllm_eplb_state_safetensors(const Plan& plan);

// Expert loads from an engine dump (read_loads calls these by extension):
//  * .pt: SGLang's expert-distribution "stat" dump, a torch.save dict with "logical_count"
//    [buffer, layers, experts] (int32); summed over the buffer dimension, as SGLang's
//    rebalance_experts does. A 2-D [layers, experts] tensor is taken as is.
//  * .safetensors: vLLM's EPLB load window: "expert_load_window" [window, layers, physical] or
//    "expert_load_pass" [layers, physical] with "physical_to_logical_map" [layers, physical]
//    (physical counts summed onto logical experts over the window, as EplbState.rearrange does),
//    or a logical "global_expert_load_window" / "logical_count" [layers, experts] or [window, layers, experts].
// Throws Error naming the file.
LoadMatrix read_engine_loads(const std::string& path);

}  // namespace ucpkit::placement
