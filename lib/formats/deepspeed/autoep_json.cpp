// The JSON form of ds_autoep_layers (autoep_json.h).
#include "formats/deepspeed/autoep_json.h"

namespace ucpkit::formats::deepspeed {

nlohmann::json autoep_layers_json(const std::vector<AutoEpLayer>& layers) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& a : layers)
    out.push_back({{"moe_layer_id", a.moe_layer_id}, {"module_path", a.module_path},
                   {"expert_key_prefix", a.expert_key_prefix}, {"num_experts", a.num_experts},
                   {"num_local_experts", a.num_local_experts}, {"ep_size", a.ep_size}});
  return out;
}

}  // namespace ucpkit::formats::deepspeed
