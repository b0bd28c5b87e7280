// Interop with LibTorch for programs that embed ucpkit (libucpkit_torch; the tools do not link it).
#pragma once
#include <ATen/core/Tensor.h>

#include "io/tensor.h"

namespace ucpkit::torch_bridge {

// A CPU at::Tensor viewing the same bytes (zero-copy; the storage stays alive while it is used).
at::Tensor to_aten(const Tensor& t);
// A ucpkit tensor holding a contiguous copy of `t` (moved to CPU first).
Tensor from_aten(const at::Tensor& t);
at::ScalarType to_scalar_type(DType t);
DType from_scalar_type(at::ScalarType t);

}  // namespace ucpkit::torch_bridge
