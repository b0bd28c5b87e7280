// Reading atomic tensors of a universal checkpoint (memory-mapped, verified against the manifest's
// checksums on first use) and copying any flat range of a target TP slice out of them.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "io/tensor.h"
#include "load/model_info.h"
#include "load/ucp_info.h"

namespace ucpkit::load {

class UniversalReader {
 public:
  UniversalReader(const ModelInfo& model, std::string dir, bool verify);
  // The fp32 tensor of `state` of parameter `param` (contiguous, mapped). Throws Error when the
  // file is missing, is not what the manifest says, or fails its checksum.
  const Tensor& tensor(int param, const std::string& state);
  // The raw step value (int or tensor) of a parameter, or nullptr when it has none.
  pickle::ValuePtr step(int param);
  uint64_t bytes_read() const { return bytes_read_; }
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::once_flag once;
    Tensor tensor;
  };
  const ModelInfo& model_;
  std::string dir_;
  bool verify_;
  std::vector<std::unique_ptr<Entry>> entries_;  // [param * states + state]
  std::atomic<uint64_t> bytes_read_{0};
};

// Copies elements [a, b) of the flattened TP slice `s` of a universal tensor with data `src` and
// shape `ushape` into `dst` (fp32). Vocabulary padding rows read as zeros.
void copy_flat_range(const float* src, const std::vector<int64_t>& ushape, const TpSlice& s, int64_t a, int64_t b,
                     float* dst);

// fp32 -> target float type, round to nearest even (as torch does); `dst` holds n * dtype_size.
void convert_from_fp32(const float* src, size_t n, DType target, uint8_t* dst);

}  // namespace ucpkit::load
