// Module weights against their fp32 masters, element by element (master_image.h).
#include "to_universal/image_difference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "io/dtype.h"

namespace ucpkit::to_universal {

namespace {

// Every s[i] is master[i] rounded to nearest even in bf16 (NaN-blind: a NaN fails and is decided by
// the exact loop). Branch-free so that it vectorizes; the AVX2 clone takes about 1.5 instructions an
// element against 24 for the exact loop, which made the check cost more than the conversion
// (docs/notes/formats-refactor.md).
__attribute__((target_clones("avx2", "default"))) bool bf16_image_holds(const float* master, const uint16_t* s,
                                                                        int64_t n) {
  uint32_t diff = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &master[i], 4);
    diff |= ((u + 0x7fffu + ((u >> 16) & 1u)) >> 16) ^ s[i];
  }
  return diff == 0;
}

constexpr int64_t kBlock = 4096;  // elements a block; a block that fails is searched element by element

}  // namespace

// Blocks that match as bytes (fp32) or by the branch-free rounding (bf16) are skipped; only a block
// that fails those is searched element by element.
int64_t first_image_difference(const float* master, int64_t n, const Tensor& weight, uint32_t* stored, uint32_t* image) {
  const Tensor w = weight.contiguous();
  const auto bytes = w.contiguous_bytes();
  if (w.dtype() == DType::Float32) {
    const float* s = reinterpret_cast<const float*>(bytes.data());
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t e = std::min(n, b + kBlock);
      if (std::memcmp(s + b, master + b, static_cast<size_t>(e - b) * 4) == 0) continue;
      for (int64_t i = b; i < e; ++i)
        if (std::memcmp(&s[i], &master[i], 4) != 0 && !(std::isnan(s[i]) && std::isnan(master[i]))) {
          std::memcpy(stored, &s[i], 4);
          std::memcpy(image, &master[i], 4);
          return i;
        }
    }
    return -1;
  }
  const uint16_t* s = reinterpret_cast<const uint16_t*>(bytes.data());
  std::vector<uint16_t> fp16;  // fp16: torch's conversion (Tensor::to), rarely used, so a copy
  if (w.dtype() == DType::Float16) {
    std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
    std::memcpy(b.data(), master, b.size());
    fp16 = Tensor::from_bytes(DType::Float32, {n}, std::move(b)).to(DType::Float16).to_vector<uint16_t>();
  }
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    if (fp16.empty() && bf16_image_holds(master + b, s + b, e - b)) continue;
    for (int64_t i = b; i < e; ++i) {
      const uint16_t r = fp16.empty() ? f32_to_bf16(master[i]) : fp16[i];
      if (r == s[i]) continue;
      const bool nan = fp16.empty() ? (s[i] & 0x7fff) > 0x7f80 && (r & 0x7fff) > 0x7f80
                                    : (s[i] & 0x7fff) > 0x7c00 && (r & 0x7fff) > 0x7c00;
      if (nan) continue;
      *stored = s[i];
      *image = r;
      return i;
    }
  }
  return -1;
}


}  // namespace ucpkit::to_universal
