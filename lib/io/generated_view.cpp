// Generated views (generated_view.h).
#include "io/generated_view.h"

#include <algorithm>
#include <memory>
#include <string>

#include "core/error.h"

namespace ucpkit {

namespace {

int64_t count(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

void require_generated(const Tensor& t, const char* what) {
  if (!t.storage() || !t.storage()->is_generated() || !t.is_contiguous() || t.storage_offset() != 0)
    throw Error(std::string(what) + ": not a contiguous generated tensor (internal)");
}

}  // namespace

Tensor generated_box(const Tensor& whole, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
  require_generated(whole, "generated_box");
  const std::vector<int64_t>& shape = whole.shape();
  if (offsets.size() != shape.size() || sizes.size() != shape.size()) throw Error("generated_box: box of another rank");
  for (size_t d = 0; d < shape.size(); ++d)
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] + sizes[d] > shape[d]) throw Error("generated_box: box outside the tensor");
  const DType dtype = whole.dtype();
  const int64_t n = count(sizes);
  auto strided = [&](std::shared_ptr<Storage> s) { return Tensor(std::move(s), 0, sizes, Tensor::contiguous_strides(sizes)); };
  if (whole.storage()->is_zero()) return strided(Storage::zero_filled(dtype, n));
  if (sizes == shape) return whole;
  const std::shared_ptr<Storage> from = whole.storage();
  const std::vector<int64_t> stride = Tensor::contiguous_strides(shape);
  const uint64_t es = dtype_size(dtype);
  const int64_t inner = sizes.empty() ? 1 : sizes.back();
  return strided(Storage::generated(dtype, n, [from, offsets, sizes, stride, es, inner](uint64_t off, std::span<uint8_t> out) {
    int64_t e = static_cast<int64_t>(off / es), left = static_cast<int64_t>(out.size() / es);
    uint8_t* to = out.data();
    while (left > 0) {
      // The run of the box's last dim holding element e: its place in `whole`.
      int64_t rest = e / inner, at = offsets.empty() ? 0 : offsets.back() + e % inner;
      for (size_t d = sizes.size() - 1; d-- > 0;) {
        at += (offsets[d] + rest % sizes[d]) * stride[d];
        rest /= sizes[d];
      }
      const int64_t len = std::min(inner - e % inner, left);
      from->generate(static_cast<uint64_t>(at) * es, {to, static_cast<size_t>(len) * es});
      e += len, left -= len, to += static_cast<size_t>(len) * es;
    }
  }));
}

Tensor generated_cast(const Tensor& t, DType dtype) {
  require_generated(t, "generated_cast");
  if (t.dtype() == dtype) return t;
  const int64_t n = t.numel();
  auto shaped = [&](std::shared_ptr<Storage> s) { return Tensor(std::move(s), 0, t.shape(), Tensor::contiguous_strides(t.shape())); };
  if (t.storage()->is_zero()) return shaped(Storage::zero_filled(dtype, n));
  const std::shared_ptr<Storage> from = t.storage();
  const DType source = t.dtype();
  const uint64_t ies = dtype_size(source), oes = dtype_size(dtype);
  return shaped(Storage::generated(dtype, n, [from, source, dtype, ies, oes](uint64_t off, std::span<uint8_t> out) {
    thread_local std::vector<uint8_t> window;
    const size_t count = out.size() / oes;
    window.resize(count * ies);
    from->generate(off / oes * ies, window);
    convert_floats(window.data(), source, out.data(), dtype, count);
  }));
}

Tensor generated_rows(const Tensor& t, std::vector<int64_t> order) {
  require_generated(t, "generated_rows");
  if (t.dim() == 0) throw Error("generated_rows: a tensor without rows (internal)");
  const int64_t rows = t.shape()[0];
  for (int64_t r : order)
    if (r < 0 || r >= rows) throw Error("generated_rows: row " + std::to_string(r) + " of " + std::to_string(rows));
  std::vector<int64_t> shape = t.shape();
  shape[0] = static_cast<int64_t>(order.size());
  const int64_t cols = rows > 0 ? t.numel() / rows : 0;
  const uint64_t es = dtype_size(t.dtype());
  const std::shared_ptr<Storage> from = t.storage();
  auto fill = [from, cols, es, order = std::move(order)](uint64_t off, std::span<uint8_t> out) {
    int64_t e = static_cast<int64_t>(off / es), left = static_cast<int64_t>(out.size() / es);
    uint8_t* to = out.data();
    while (left > 0) {
      const int64_t c = e % cols, len = std::min(cols - c, left);
      from->generate(static_cast<uint64_t>(order[static_cast<size_t>(e / cols)] * cols + c) * es, {to, static_cast<size_t>(len) * es});
      e += len, left -= len, to += static_cast<size_t>(len) * es;
    }
  };
  return Tensor(Storage::generated(t.dtype(), count(shape), fill), 0, shape, Tensor::contiguous_strides(shape));
}

}  // namespace ucpkit
