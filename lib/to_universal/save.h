// Save: the universal layout files (formats.md section 3) as ds_to_universal writes them.
#pragma once
#include <cstdint>
#include <string>

#include "io/pickle/value.h"
#include "io/tensor.h"
#include "patterns/pattern_set.h"

namespace ucpkit::to_universal {

// The dict of one zero/<param>/<state>.pt: rule metadata (cat_dim, param_n_sub_params,
// sub_param_shape as a deepspeed SubparamShape object), vocab_tensor, then param.
pickle::ValuePtr state_file_value(const Tensor& param, const patterns::ParamRule& rule,
                                  const patterns::PatternSet& set);

// zero/optimizer_state.pt: the rank-0 optimizer_state_dict minus the sharded entries, plus
// param_groups (hyper-parameters) from base_optimizer_state.
pickle::ValuePtr common_optimizer_state(const pickle::ValuePtr& optimizer_shard_root, const std::string& path);

// CRC-32 of a tensor's element bytes (manifest checksums).
uint32_t tensor_crc32(const Tensor& t);

}  // namespace ucpkit::to_universal
