// Is a module weight the low-precision image of its fp32 master? (master_image.h: DeepSpeed copies
// each fp32 partition into the bit16 parameters after every step, rounding to nearest even.)
#pragma once
#include <cstdint>

#include "io/tensor.h"

namespace ucpkit::to_universal {

// The first of `n` elements where `weight` (bf16, fp16 or fp32, `n` elements) is not `master`
// rounded to weight's dtype; -1 when none. On a difference, *stored and *image get the bits of the
// weight's element and of the rounded master. NaN agrees with any NaN: torch rounds every NaN to one
// quiet NaN (c10 round_to_nearest_even drops the sign), other converters keep it.
int64_t first_image_difference(const float* master, int64_t n, const Tensor& weight, uint32_t* stored, uint32_t* image);

}  // namespace ucpkit::to_universal
