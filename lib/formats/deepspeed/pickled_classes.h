// DeepSpeed's own classes as they appear in checkpoint pickles: one builder per class, pickled the
// way Python's pickler writes an instance of it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// deepspeed.utils.tensor_fragment.fragment_address(numel, start): a param_slice_mappings entry
// (utils/tensor_fragment.py, a dataclass).
pickle::ValuePtr fragment_address(int64_t numel, int64_t start);

// deepspeed.runtime.zero.config.ZeroStageEnum(stage) (runtime/zero/config.py, `class ZeroStageEnum(int, Enum)`), pickled
// as REDUCE ZeroStageEnum((stage,)). Python >= 3.12's pickler writes getattr(ZeroStageEnum, name)
// instead; torch.load gives the same member either way.
pickle::ValuePtr zero_stage_enum(int stage);

// The loss scaler an optimizer of `dtype` starts with: fp16 DynamicLossScaler with DeepSpeed's
// defaults (runtime/fp16/loss_scaler.py: init_scale 2**16, scale_window 1000, min_scale 1), a
// static LossScaler(cur_scale=1) otherwise (the state ucpkit has always written).
pickle::ValuePtr loss_scaler(DType dtype);

// deepspeed.checkpoint.universal_checkpoint.SubparamShape (checkpoint/universal_checkpoint.py, a
// dataclass): `shape` with entry `partition_dim` replaced by the sub-parameter sizes (a tuple) or,
// when !sizes_as_tuple, by their count.
pickle::ValuePtr subparam_shape(const std::vector<std::string>& patterns, const std::vector<int64_t>& shape,
                                int64_t partition_dim, const std::vector<int64_t>& sub_sizes, bool sizes_as_tuple);

}  // namespace ucpkit::formats::deepspeed
