// One layer (and expert) of a stacked Megatron-Core tensor read from only the DCP chunks that hold
// it: a `decoder.layers.<param>` stack is saved as one chunk per layer and TP piece (the layer axis
// is a ShardedTensor offset, transformer_block.py), so reading layer L needs those chunks, not the
// whole stack; reading every layer costs one pass over the stack instead of one per layer, and memory
// is one parameter. (formats/dcp/reader assembles whole tensors only; its box copy is private, so
// this file has its own.)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/dcp/reader.h"
#include "io/tensor.h"

namespace ucpkit::formats::megatron_core {

// The tensor `fqn` at `index` on its leading axes, shape size[index.size():]. Assembled from the
// chunks that lie in that slice when each has extent 1 on the leading axes (checked to tile the
// slice exactly, else Error naming .metadata); otherwise the whole tensor is read and sliced.
Tensor read_leading_slice(const dcp::Reader& reader, const std::string& fqn, const std::vector<int64_t>& index);

}  // namespace ucpkit::formats::megatron_core
