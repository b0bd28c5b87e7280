// Views of generated tensors (Storage::generated: bytes made on demand, window by window) that stay generated: a box
// of one, and one cast to another floating dtype. Writers that stream (torch.save zips, DCP data files) take them
// without the whole tensor ever being in memory.
#pragma once
#include <cstdint>
#include <vector>

#include "io/dtype.h"
#include "io/tensor.h"

namespace ucpkit {

// The box (`offsets`, `sizes`, in the dims of `whole`, a contiguous generated tensor) as a contiguous generated
// tensor: each window asks `whole` for the runs of the box's last dim it covers. A box of a zero-filled storage is
// zero-filled. Throws Error for a box outside `whole` or a `whole` that is not generated and contiguous.
Tensor generated_box(const Tensor& whole, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes);

// A contiguous generated tensor of floating values in `dtype`, each value as Tensor::to converts it.
Tensor generated_cast(const Tensor& t, DType dtype);

// The rows (first-dim slices) of a contiguous generated tensor in another order: row i of the result is row
// order[i] of `t` (a permutation, or any selection: the result has order.size() rows). Error for a row out of range.
Tensor generated_rows(const Tensor& t, std::vector<int64_t> order);

}  // namespace ucpkit
