// Lazy tensors over mapped or owned storages.
#include "io/tensor.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/shape.h"

namespace ucpkit {
namespace {

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(std::string("size overflow in ") + what);
  return r;
}

uint16_t f32_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7fffff;
  int exp = static_cast<int>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | (mant ? 0x7E00 : 0x7C00));
  int e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7C00);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    int shift = 14 - e;
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) half++;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return static_cast<uint16_t>(sign | half);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        mant <<= 1;
        e++;
      } while (!(mant & 0x400));
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7F800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

// Reads element `i` of a floating buffer as double (memcpy: buffers may be unaligned).
double load_float(const uint8_t* p, DType t) {
  switch (t) {
    case DType::Float32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::Float64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::Float16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return f16_to_f32(v);
    }
    case DType::BFloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return bf16_to_f32(v);
    }
    default:
      throw Error("not a floating dtype");
  }
}

void store_float(uint8_t* p, DType t, double v, DType source) {
  // Narrowing from float64 goes through float32 first, as torch does for half types.
  float f = static_cast<float>(v);
  (void)source;
  switch (t) {
    case DType::Float32:
      std::memcpy(p, &f, 4);
      break;
    case DType::Float64:
      std::memcpy(p, &v, 8);
      break;
    case DType::Float16: {
      uint16_t h = f32_to_f16(f);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::BFloat16: {
      uint16_t h = f32_to_bf16(f);
      std::memcpy(p, &h, 2);
      break;
    }
    default:
      throw Error("not a floating dtype");
  }
}

}  // namespace

// ---------------- Storage ----------------

std::shared_ptr<Storage> Storage::mapped(DType dtype, int64_t numel, std::shared_ptr<const MappedFile> file,
                                         uint64_t offset) {
  auto s = std::make_shared<Storage>();
  s->dtype_ = dtype;
  s->numel_ = numel;
  if (numel < 0) throw Error("negative storage size");
  uint64_t need = static_cast<uint64_t>(checked_mul(numel, static_cast<int64_t>(dtype_size(dtype)), "storage"));
  if (offset > file->size() || need > file->size() - offset)
    fail(file->path(), "storage of " + std::to_string(need) + " bytes at offset " + std::to_string(offset) +
                           " runs past the end of the file");
  s->file_ = std::move(file);
  s->offset_ = offset;
  return s;
}

std::shared_ptr<Storage> Storage::reinterpret(DType dtype) {
  if (dtype == dtype_) return shared_from_this();
  const uint64_t size = dtype_size(dtype);
  if (nbytes() % size) throw Error("storage of " + std::to_string(nbytes()) + " bytes is not a whole number of " +
                                   std::string(dtype_name(dtype)) + " elements");
  const auto numel = static_cast<int64_t>(nbytes() / size);
  std::shared_ptr<Storage> s;
  if (file_) {
    s = mapped(dtype, numel, file_, offset_);
  } else if (!generator_ && !unbound_) {
    const auto b = bytes();
    s = owned(dtype, std::vector<uint8_t>(b.begin(), b.end()));
  } else {
    throw Error("cannot reinterpret a generated or unbound storage");
  }
  s->key = key;
  s->location = location;
  return s;
}

std::shared_ptr<Storage> Storage::owned(DType dtype, std::vector<uint8_t> bytes) {
  if (bytes.size() % dtype_size(dtype) != 0) throw Error("storage byte size is not a multiple of the element size");
  auto s = std::make_shared<Storage>();
  s->dtype_ = dtype;
  s->numel_ = static_cast<int64_t>(bytes.size() / dtype_size(dtype));
  s->owned_ = std::move(bytes);
  return s;
}

std::shared_ptr<Storage> Storage::zeros(DType dtype, int64_t numel) {
  return owned(dtype, std::vector<uint8_t>(static_cast<size_t>(numel) * dtype_size(dtype), 0));
}

std::shared_ptr<Storage> Storage::uninitialized(DType dtype, int64_t numel) {
  if (numel < 0) throw Error("negative storage size");
  const int64_t n = checked_mul(numel, static_cast<int64_t>(dtype_size(dtype)), "storage");
  auto s = std::make_shared<Storage>();
  s->dtype_ = dtype;
  s->numel_ = numel;
  s->uninitialized_.reset(new uint8_t[static_cast<size_t>(n)]);  // default-initialized: no zero fill
  return s;
}

void Storage::truncate(int64_t numel) {
  if (file_ || generator_ || unbound_) throw Error("storage '" + key + "' is not owned: it cannot be truncated");
  if (numel < 0 || numel > numel_) throw Error("storage '" + key + "' cannot grow by truncate");
  numel_ = numel;
  if (!uninitialized_) owned_.resize(static_cast<size_t>(nbytes()));
}

std::shared_ptr<Storage> Storage::generated(DType dtype, int64_t numel, Generator fill) {
  if (numel < 0) throw Error("negative storage size");
  if (!fill) throw Error("generated storage without a generator");
  checked_mul(numel, static_cast<int64_t>(dtype_size(dtype)), "storage");
  auto s = std::make_shared<Storage>();
  s->dtype_ = dtype;
  s->numel_ = numel;
  s->generator_ = std::move(fill);
  return s;
}

std::shared_ptr<Storage> Storage::zero_filled(DType dtype, int64_t numel) {
  auto s = generated(dtype, numel, [](uint64_t, std::span<uint8_t> out) { std::memset(out.data(), 0, out.size()); });
  s->zero_ = true;
  return s;
}

void Storage::generate(uint64_t offset, std::span<uint8_t> out) const {
  if (!generator_) throw Error("storage '" + key + "' is not generated");
  const uint64_t es = dtype_size(dtype_);
  if (offset % es != 0 || out.size() % es != 0 || offset > nbytes() || out.size() > nbytes() - offset)
    throw Error("generated storage: bytes [" + std::to_string(offset) + ", +" + std::to_string(out.size()) +
                ") are not whole elements inside the storage");
  generator_(offset, out);
}

std::shared_ptr<Storage> Storage::unbound(DType dtype, int64_t numel) {
  if (numel < 0) throw Error("negative storage size");
  checked_mul(numel, static_cast<int64_t>(dtype_size(dtype)), "storage");
  auto s = std::make_shared<Storage>();
  s->dtype_ = dtype;
  s->numel_ = numel;
  s->unbound_ = true;
  return s;
}

void Storage::bind(std::shared_ptr<const MappedFile> file, uint64_t offset) {
  uint64_t need = nbytes();
  if (offset > file->size() || need > file->size() - offset)
    fail(file->path(), "storage '" + key + "' of " + std::to_string(need) + " bytes at offset " +
                           std::to_string(offset) + " runs past the end of the file");
  file_ = std::move(file);
  offset_ = offset;
  unbound_ = false;
}

std::span<const uint8_t> Storage::bytes() const {
  if (unbound_) throw Error("storage '" + key + "' has no data");
  if (generator_)
    throw Error("storage '" + key + "' is generated on demand (only save_torch_file can write it), it has no bytes");
  if (file_) return {file_->data() + offset_, static_cast<size_t>(nbytes())};
  if (uninitialized_) return {uninitialized_.get(), static_cast<size_t>(nbytes())};
  return {owned_.data(), owned_.size()};
}

std::span<uint8_t> Storage::mutable_bytes() {
  if (file_) throw Error("storage '" + key + "' is memory-mapped read-only");
  if (generator_) throw Error("storage '" + key + "' is generated on demand, it has no bytes");
  if (uninitialized_) return {uninitialized_.get(), static_cast<size_t>(nbytes())};
  return {owned_.data(), owned_.size()};
}

// ---------------- Tensor ----------------

Tensor::Tensor(std::shared_ptr<Storage> storage, int64_t storage_offset, std::vector<int64_t> shape,
               std::vector<int64_t> strides)
    : storage_(std::move(storage)), offset_(storage_offset), shape_(std::move(shape)), strides_(std::move(strides)) {
  if (!storage_) throw Error("tensor without storage");
  if (shape_.size() != strides_.size())
    throw Error("tensor has " + std::to_string(shape_.size()) + " sizes but " + std::to_string(strides_.size()) +
                " strides");
  if (offset_ < 0) throw Error("negative storage offset");
  int64_t n = 1, extent = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    if (shape_[d] < 0) throw Error("negative tensor size");
    if (strides_[d] < 0) throw Error("negative tensor stride");
    n = checked_mul(n, shape_[d], "tensor shape");
  }
  if (n > 0) {
    for (size_t d = 0; d < shape_.size(); ++d)
      if (__builtin_add_overflow(extent, checked_mul(shape_[d] - 1, strides_[d], "tensor extent"), &extent))
        throw Error("size overflow in tensor extent");
    int64_t end;
    if (__builtin_add_overflow(offset_, extent + 1, &end) || end > storage_->numel())
      throw Error("tensor view (offset " + std::to_string(offset_) + ", extent " + std::to_string(extent + 1) +
                  ") does not fit its storage of " + std::to_string(storage_->numel()) + " elements");
  }
}

std::vector<int64_t> Tensor::contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> st(shape.size());
  int64_t s = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    st[d] = s;
    s *= std::max<int64_t>(shape[d], 1);
  }
  return st;
}

Tensor Tensor::from_bytes(DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes) {
  int64_t n = 1;
  for (auto d : shape) n = checked_mul(n, d, "tensor shape");
  if (static_cast<uint64_t>(n) * dtype_size(dtype) != bytes.size())
    throw Error("tensor data size does not match its shape");
  auto strides = contiguous_strides(shape);
  return Tensor(Storage::owned(dtype, std::move(bytes)), 0, std::move(shape), std::move(strides));
}

Tensor Tensor::zeros(DType dtype, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n = checked_mul(n, d, "tensor shape");
  return from_bytes(dtype, std::move(shape), std::vector<uint8_t>(static_cast<size_t>(n) * dtype_size(dtype)));
}

int64_t Tensor::numel() const { return numel_of(shape_); }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // as torch: strides of an empty tensor do not matter
  int64_t expected = 1;
  for (size_t d = shape_.size(); d-- > 0;) {
    if (shape_[d] == 1) continue;
    if (strides_[d] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

std::span<const uint8_t> Tensor::contiguous_bytes() const {
  if (!is_contiguous()) throw Error("tensor is not contiguous");
  if (!storage_ || numel() == 0) return {};
  auto all = storage_->bytes();
  size_t es = dtype_size(dtype());
  return all.subspan(static_cast<size_t>(offset_) * es, static_cast<size_t>(nbytes()));
}

void Tensor::copy_to(void* dst) const {
  if (numel() == 0) return;
  if (is_contiguous()) {
    auto b = contiguous_bytes();
    std::memcpy(dst, b.data(), b.size());
    return;
  }
  const size_t es = dtype_size(dtype());
  // Collapse the trailing dims that are contiguous into one block copied with memcpy.
  int inner = static_cast<int>(shape_.size());
  int64_t block = 1;
  while (inner > 0 && (shape_[inner - 1] == 1 || strides_[inner - 1] == block)) {
    block *= shape_[inner - 1];
    --inner;
  }
  const uint8_t* base = storage_->bytes().data();
  uint8_t* out = static_cast<uint8_t*>(dst);
  std::vector<int64_t> idx(static_cast<size_t>(inner), 0);
  const size_t block_bytes = static_cast<size_t>(block) * es;
  while (true) {
    int64_t off = offset_;
    for (int d = 0; d < inner; ++d) off += idx[d] * strides_[d];
    std::memcpy(out, base + static_cast<size_t>(off) * es, block_bytes);
    out += block_bytes;
    int d = inner - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
    if (d < 0) break;
  }
}

namespace {
// A contiguous tensor over uninitialized bytes, for results whose every byte is written next.
Tensor unfilled(DType dtype, const std::vector<int64_t>& shape) {
  return Tensor(Storage::uninitialized(dtype, numel_of(shape)), 0, shape, Tensor::contiguous_strides(shape));
}
uint8_t* data_of(const Tensor& t) { return t.storage()->mutable_bytes().data(); }
}  // namespace

Tensor Tensor::contiguous(bool force_copy) const {
  if (is_contiguous() && !force_copy) return *this;
  Tensor t = unfilled(dtype(), shape_);
  copy_to(data_of(t));
  t.requires_grad = requires_grad;
  t.is_parameter = is_parameter;
  return t;
}

namespace {
// `n` values of type In at `in` to type Out at `out` through `f` (memcpy: the buffers may be unaligned).
template <class In, class Out, class F>
void convert_each(const uint8_t* in, uint8_t* out, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) {
    In x;
    std::memcpy(&x, in + sizeof(In) * i, sizeof(In));
    const Out y = f(x);
    std::memcpy(out + sizeof(Out) * i, &y, sizeof(Out));
  }
}
}  // namespace

void convert_floats(const uint8_t* in, DType from, uint8_t* out, DType to, size_t n) {
  if (from == to) return (void)std::memcpy(out, in, n * dtype_size(from));
  // The import's upcast and the model copy of an fp32 master: the bits load_float / store_float give.
  // (Lambdas, not function pointers: inlined, the loops vectorize.)
  if (from == DType::BFloat16 && to == DType::Float32)
    return convert_each<uint16_t, float>(in, out, n, [](uint16_t h) { return bf16_to_f32(h); });
  if (from == DType::Float32 && to == DType::BFloat16)
    return convert_each<float, uint16_t>(in, out, n, [](float f) { return f32_to_bf16(f); });
  const size_t ies = dtype_size(from), oes = dtype_size(to);
  for (size_t i = 0; i < n; ++i) store_float(out + i * oes, to, load_float(in + i * ies, from), from);
}

Tensor Tensor::to(DType target) const {
  if (target == dtype()) return contiguous();
  if (!dtype_is_floating(dtype()) || !dtype_is_floating(target))
    throw Error("conversion supports floating dtypes only (" + std::string(dtype_name(dtype())) + " -> " +
                std::string(dtype_name(target)) + ")");
  Tensor src = contiguous();
  auto in = src.contiguous_bytes();
  const size_t n = static_cast<size_t>(numel());
  const size_t ies = dtype_size(dtype()), oes = dtype_size(target);
  Tensor t = unfilled(target, shape_);
  uint8_t* out = data_of(t);
  for (size_t i = 0; i < n; ++i) store_float(out + i * oes, target, load_float(in.data() + i * ies, dtype()), dtype());
  return t;
}

Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  if (dim < 0 || dim >= this->dim()) throw Error("narrow: dimension out of range");
  if (start < 0 || length < 0 || start + length > shape_[dim]) throw Error("narrow: range out of bounds");
  Tensor t = *this;
  t.offset_ = offset_ + (length > 0 ? start * strides_[dim] : 0);
  t.shape_[dim] = length;
  return t;
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  int64_t n = 1;
  for (auto d : shape) n = checked_mul(n, d, "reshape");
  if (n != numel()) throw Error("reshape: element count differs");
  Tensor src = contiguous();
  auto strides = contiguous_strides(shape);
  return Tensor(src.storage_, src.offset_, std::move(shape), std::move(strides));
}

bool Tensor::equal(const Tensor& other) const {
  if (dtype() != other.dtype() || shape_ != other.shape_) return false;
  Tensor a = contiguous(), b = other.contiguous();
  auto x = a.contiguous_bytes(), y = b.contiguous_bytes();
  return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size()) == 0);
}

Tensor cat(const std::vector<Tensor>& parts, int64_t dim) {
  if (parts.empty()) throw Error("cat: no tensors");
  const Tensor& first = parts.front();
  if (dim < 0 || dim >= first.dim()) throw Error("cat: dimension out of range");
  std::vector<int64_t> shape = first.shape();
  shape[dim] = 0;
  for (const auto& p : parts) {
    if (p.dtype() != first.dtype() || p.dim() != first.dim()) throw Error("cat: dtype or rank mismatch");
    for (int64_t d = 0; d < first.dim(); ++d)
      if (d != dim && p.shape()[d] != first.shape()[d]) throw Error("cat: shape mismatch");
    shape[dim] += p.shape()[dim];
  }
  int64_t outer = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[d];
  std::vector<Tensor> cont;
  std::vector<size_t> row_bytes;
  for (const auto& p : parts) {
    cont.push_back(p.contiguous());
    row_bytes.push_back(outer ? static_cast<size_t>(p.nbytes() / static_cast<uint64_t>(outer)) : 0);
  }
  Tensor out = unfilled(first.dtype(), shape);  // every byte is written below
  uint8_t* w = data_of(out);
  for (int64_t o = 0; o < outer; ++o)
    for (size_t i = 0; i < cont.size(); ++i) {
      if (row_bytes[i] == 0) continue;
      std::memcpy(w, cont[i].contiguous_bytes().data() + o * row_bytes[i], row_bytes[i]);
      w += row_bytes[i];
    }
  return out;
}

}  // namespace ucpkit
