// Tensor element types.
#include "io/dtype.h"

#include <array>

namespace ucpkit {
namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  bool floating;
  std::string_view name, storage, safetensors;
};
constexpr std::array<DTypeInfo, 10> kInfo{{
    {DType::Float32, 4, true, "float32", "FloatStorage", "F32"},
    {DType::Float16, 2, true, "float16", "HalfStorage", "F16"},
    {DType::BFloat16, 2, true, "bfloat16", "BFloat16Storage", "BF16"},
    {DType::Float64, 8, true, "float64", "DoubleStorage", "F64"},
    {DType::Int8, 1, false, "int8", "CharStorage", "I8"},
    {DType::Int16, 2, false, "int16", "ShortStorage", "I16"},
    {DType::Int32, 4, false, "int32", "IntStorage", "I32"},
    {DType::Int64, 8, false, "int64", "LongStorage", "I64"},
    {DType::UInt8, 1, false, "uint8", "ByteStorage", "U8"},
    {DType::Bool, 1, false, "bool", "BoolStorage", "BOOL"},
}};
const DTypeInfo& info(DType t) { return kInfo[static_cast<size_t>(t)]; }
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
bool dtype_is_floating(DType t) { return info(t).floating; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view dtype_storage_class(DType t) { return info(t).storage; }
std::string_view dtype_safetensors_name(DType t) { return info(t).safetensors; }

std::optional<DType> dtype_from_name(std::string_view name) {
  if (name.starts_with("torch.")) name.remove_prefix(6);
  for (const auto& i : kInfo)
    if (i.name == name) return i.type;
  struct Alias {
    std::string_view alias;
    DType type;
  };
  static constexpr Alias aliases[] = {
      {"float", DType::Float32},  {"fp32", DType::Float32},   {"half", DType::Float16},
      {"fp16", DType::Float16},   {"bf16", DType::BFloat16},  {"double", DType::Float64},
      {"fp64", DType::Float64},   {"short", DType::Int16},    {"int", DType::Int32},
      {"long", DType::Int64},
  };
  for (const auto& a : aliases)
    if (a.alias == name) return a.type;
  return std::nullopt;
}

std::optional<DType> dtype_from_storage_class(std::string_view name) {
  for (const auto& i : kInfo)
    if (i.storage == name) return i.type;
  return std::nullopt;
}

}  // namespace ucpkit
