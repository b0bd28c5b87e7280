// AutoEP under ZeRO-3: the DP ranks' agreement.
#include "formats/deepspeed/autoep_zero3_ranks.h"

#include "core/error.h"

namespace ucpkit::formats::deepspeed {

void check_autoep_ranks_agree(const std::vector<std::vector<AutoEpLayer>>& of_rank,
                              const std::vector<std::string>& model_files, int dp) {
  const std::vector<AutoEpLayer>& autoep = of_rank.at(0);
  for (size_t i = 0; i < autoep.size(); ++i) {
    for (int d = 1; d < dp; ++d) {
      const auto& o = of_rank.at(d);
      if (o.size() != autoep.size() || o[i].expert_key_prefix != autoep[i].expert_key_prefix ||
          o[i].num_experts != autoep[i].num_experts || o[i].ep_size != autoep[i].ep_size ||
          o[i].moe_layer_id != autoep[i].moe_layer_id)
        fail(model_files.at(d), "ds_autoep_layers differ from " + model_files[0] +
                                    " in more than the saving rank's place (files of different saves?)");
    }
    if (dp % autoep[i].ep_size != 0 || autoep[i].expert_data_parallel_world_size != dp / autoep[i].ep_size)
      fail(model_files[0], "ds_autoep_layers (" + autoep[i].expert_key_prefix + "): ep_size " +
                               std::to_string(autoep[i].ep_size) + " and expert_data_parallel_world_size " +
                               std::to_string(autoep[i].expert_data_parallel_world_size) + " do not fit " +
                               std::to_string(dp) + " DP ranks");
  }
}

}  // namespace ucpkit::formats::deepspeed
