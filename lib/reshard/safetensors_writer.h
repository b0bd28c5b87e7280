// Export of the weights (no optimizer state) as Hugging Face safetensors shards plus
// model.safetensors.index.json, in the requested dtype. Names and shapes are the universal ones.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/dtype.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"

namespace ucpkit::reshard {

// Which tensors go to which shard file (greedy in model order, each shard at most `shard_bytes`
// unless a single tensor is larger). Pure. Index i < params.size() is parameter i, in `dtype`; the
// indices after them are the buffers (ModelInfo::buffers, i - params.size()), each in its own dtype.
std::vector<std::vector<int>> safetensors_shards(const ModelInfo& model, DType dtype, uint64_t shard_bytes);
// Name, shape, dtype and byte count of tensor `i` of the shards above.
const std::string& safetensors_name(const ModelInfo& model, int i);
const std::vector<int64_t>& safetensors_shape(const ModelInfo& model, int i);
DType safetensors_dtype(const ModelInfo& model, int i, DType dtype);
uint64_t safetensors_bytes(const ModelInfo& model, int i, DType dtype);
std::vector<std::vector<int>> safetensors_shards(const ModelInfo& model, DType dtype, uint64_t shard_bytes);

// Writes the shards and the index into `dir`; returns bytes written.
uint64_t write_safetensors(const ModelInfo& model, UniversalReader& reader, DType dtype, uint64_t shard_bytes,
                           const std::string& dir, int threads);

}  // namespace ucpkit::reshard
