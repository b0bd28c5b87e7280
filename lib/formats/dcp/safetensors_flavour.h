// DCP's safetensors flavour: torch.distributed.checkpoint.HuggingFaceStorageWriter (torch >= 2.8;
// read here from torch 2.14.1's real output) writes no `.metadata` pickle. With save_distributed=True
// every rank writes `shard-{rank+1:05}-model-{k:05}-of-{n:05}.safetensors` whose `__metadata__` holds
// "DCP_SHARDING_INFO" (JSON {fqn: {"saved_offsets": [...]}}), "DCP_VERSION" and "format": "pt";
// each tensor of the file is one chunk, its raw little-endian bytes at the header's data_offsets
// (torch 2.14.1 checkpoint/hf_storage.py:95-137, _hf_utils.py:10-50, filesystem.py:454-467). The
// global size of a tensor is the largest offset + shape over its chunks, as HuggingFaceStorageReader
// rebuilds it (hf_storage.py:313-391). docs/formats-dcp.md, "The safetensors flavour".
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/dcp/metadata.h"
#include "io/tensor.h"

namespace ucpkit::formats::dcp {

// The `*.safetensors` files directly in `dir` (sorted by name) when `dir` has no `.metadata` and every
// one of them carries DCP's "DCP_SHARDING_INFO" or "DCP_VERSION" in its `__metadata__` (a plain
// Hugging Face model folder, e.g. the consolidated output of enable_consolidation=True, has none);
// else empty. Reads the files' headers only. Throws Error naming a file whose header is malformed.
std::vector<std::string> safetensors_flavour_files(const std::string& dir);

// The files' tensors as one Metadata (path: the first file): one Entry per fqn in order of first
// appearance (files in the order given, tensors in header order), one chunk and one raw Item per
// tensor of a file at its saved_offsets (all zeros without DCP_SHARDING_INFO, as torch reads a plain
// file); relative paths are the file names. Errors name the file: a malformed header, a dtype
// ucpkit has no type for, saved_offsets missing or of another rank than the shape, data_offsets
// outside the file or not holding shape x dtype bytes, two files disagreeing on a tensor's dtype.
Metadata read_safetensors_metadata(const std::vector<std::string>& files);

// A raw chunk (the HuggingFace flavour's item): `bytes` must hold exactly sizes x dtype; `name` is
// named in errors.
Tensor raw_chunk(std::span<const uint8_t> bytes, DType dtype, const std::vector<int64_t>& sizes,
                 const std::string& name);

// The world size of a save_distributed folder: the highest `shard-<n>-` prefix of its files
// (shard_index = rank + 1, hf_storage.py:95-104); 1 when the files carry no such prefix.
int safetensors_world_size(const std::vector<std::string>& files);

}  // namespace ucpkit::formats::dcp
