// Small safetensors files held in memory: 8-byte little-endian header length, JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}, raw bytes
// (little-endian, row-major). For index-sized tensors (plans, load counters); model weights are
// streamed by reshard/safetensors_writer.h.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ucpkit {

struct SafetensorsTensor {
  std::string dtype;  // "I64", "I32", "F32", "F64", ...
  std::vector<int64_t> shape;
  std::string bytes;

  int64_t numel() const;
  // Elements converted to double (I8/I16/I32/I64/U8/F32/F64); throws Error for other dtypes.
  std::vector<double> to_doubles(const std::string& name) const;
};

// One tensor of a file written as a stream: its header entry; its `bytes` follow the previous tensor's.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "BF16", "F32", ...
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};
// The 8-byte little-endian length and the JSON header (padded with spaces so the data starts 8-byte
// aligned, as the reference writer pads) of a file holding `entries` back to back in that order.
std::string safetensors_header(const std::vector<SafetensorsEntry>& entries,
                               const std::map<std::string, std::string>& metadata = {});

// Tensors in the order given (names sorted by the writer, as safetensors does).
std::string safetensors_bytes(const std::map<std::string, SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
std::string safetensors_tensor_i64(const std::vector<int64_t>& values);
// The name transformers' save_pretrained gives shard k (0-based) of `count`: model.safetensors when there is
// one, else model-0000{k+1}-of-0000{count}.safetensors.
std::string safetensors_shard_file(size_t k, size_t count);

// A tensor of a file's header: dtype, shape, and where its bytes are in the file (absolute offsets).
struct SafetensorsEntryAt {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};
// Parses the header of a file whose bytes are `bytes` (a mapped file: only the header is read) and
// checks every entry (known dtype, offsets inside the file, sizes matching shape and dtype); throws Error
// naming `name` and the tensor.
std::map<std::string, SafetensorsEntryAt> parse_safetensors_header(std::string_view bytes, const std::string& name,
                                                                   std::map<std::string, std::string>* metadata = nullptr);

// Parses a whole file held in memory; throws Error naming `name` on a malformed header or offsets.
std::map<std::string, SafetensorsTensor> parse_safetensors(const std::string& bytes, const std::string& name,
                                                           std::map<std::string, std::string>* metadata = nullptr);

}  // namespace ucpkit
