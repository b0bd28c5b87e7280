// Tensor element types of torch checkpoints and their names in Python and in storage classes.
#pragma once
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

}  // namespace ucpkit
