// Tensor element types of torch checkpoints and their names in Python and in storage classes.
#pragma once
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ucpkit {

enum class DType : uint8_t { Float32, Float16, BFloat16, Float64, Int8, Int16, Int32, Int64, UInt8, Bool };

size_t dtype_size(DType t);
bool dtype_is_floating(DType t);
// Canonical Python name without the "torch." prefix: "float32", "bfloat16", "int64", "bool"...
std::string_view dtype_name(DType t);
// Storage class name: "FloatStorage", "BFloat16Storage", ...
std::string_view dtype_storage_class(DType t);
// Accepts Python dtype names and aliases ("float", "half", "bf16", "fp32", "long"...).
std::optional<DType> dtype_from_name(std::string_view name);
// From a storage class name ("BFloat16Storage"), as found in pickled persistent ids.
std::optional<DType> dtype_from_storage_class(std::string_view name);
// Safetensors dtype tag ("F32", "BF16", ...).
std::string_view dtype_safetensors_name(DType t);

// fp32 -> bf16, rounded to nearest even (torch's rule); a NaN becomes the quiet NaN 0x7FC0 with its
// sign kept. Inline: ucp-load's writers call it once per element (load/universal_reader).
inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

}  // namespace ucpkit
