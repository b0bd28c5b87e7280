// SwiGLU `linear_fc1` (gated linear unit): Megatron-Core stores the global weight as [W_all; V_all]
// (gate rows of every TP rank, then up rows of every TP rank: transformer/mlp.py
// apply_swiglu_sharded_factory), while TP rank r holds [W_r; V_r] in memory, the layout Megatron-LM /
// Megatron-DeepSpeed checkpoints split by TP rank carry. These convert one parameter (no layer or
// expert axis) between the two; rows are dim 0.
#pragma once
#include <cstdint>

#include "io/tensor.h"

namespace ucpkit::formats::megatron_core {

// Rank `rank`'s [W_r; V_r] (2 * rows / (2 * tp) rows) out of the stored [W_all; V_all]. Throws Error
// when the rows do not split into 2 * tp equal parts.
Tensor swiglu_tp_local(const Tensor& stored, int64_t tp, int64_t rank);

// The stored [W_all; V_all] from the tp ranks' [W_r; V_r] (inverse of swiglu_tp_local).
Tensor swiglu_from_tp_locals(const std::vector<Tensor>& locals);

}  // namespace ucpkit::formats::megatron_core
