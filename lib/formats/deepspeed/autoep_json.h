// The JSON form of DeepSpeed AutoEP's `ds_autoep_layers` (autoep.h AutoEpLayer) as an extract plan's
// and a universal manifest's source.autoep list them: one object per layer with the fields of the
// saved dict ucp-load needs back (moe_layer_id, module_path, expert_key_prefix, num_experts,
// num_local_experts, ep_size). Its own file so that autoep.h stays free of nlohmann/json.
#pragma once
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/autoep.h"

namespace ucpkit::formats::deepspeed {

nlohmann::json autoep_layers_json(const std::vector<AutoEpLayer>& layers);

}  // namespace ucpkit::formats::deepspeed
