// LibTorch interop.
#include "torch_bridge/torch_bridge.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace ucpkit::torch_bridge {

at::ScalarType to_scalar_type(DType t) {
  switch (t) {
    case DType::Float32: return at::kFloat;
    case DType::Float16: return at::kHalf;
    case DType::BFloat16: return at::kBFloat16;
    case DType::Float64: return at::kDouble;
    case DType::Int8: return at::kChar;
    case DType::Int16: return at::kShort;
    case DType::Int32: return at::kInt;
    case DType::Int64: return at::kLong;
    case DType::UInt8: return at::kByte;
    case DType::Bool: return at::kBool;
  }
  throw Error("unknown dtype");
}

DType from_scalar_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::Float32;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kDouble: return DType::Float64;
    case at::kChar: return DType::Int8;
    case at::kShort: return DType::Int16;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kByte: return DType::UInt8;
    case at::kBool: return DType::Bool;
    default: throw Error("unsupported LibTorch dtype " + std::string(c10::toString(t)));
  }
}

at::Tensor to_aten(const Tensor& t) {
  auto storage = t.storage();
  auto bytes = storage->bytes();
  auto keep = new std::shared_ptr<Storage>(storage);
  auto opts = at::TensorOptions().dtype(to_scalar_type(t.dtype())).device(at::kCPU);
  auto base = at::from_blob(const_cast<uint8_t*>(bytes.data()), {storage->numel()}, [keep](void*) { delete keep; },
                            opts);
  return base.as_strided(t.shape(), t.strides(), t.storage_offset());
}

Tensor from_aten(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU).contiguous();
  std::vector<int64_t> shape(c.sizes().begin(), c.sizes().end());
  std::vector<uint8_t> bytes(c.nbytes());
  if (!bytes.empty()) std::memcpy(bytes.data(), c.data_ptr(), bytes.size());
  return Tensor::from_bytes(from_scalar_type(c.scalar_type()), std::move(shape), std::move(bytes));
}

}  // namespace ucpkit::torch_bridge
