#include "formats/megatron_core/leading_slice.h"

#include <cstring>

#include "core/error.h"
#include "io/dtype.h"

namespace ucpkit::formats::megatron_core {

namespace {

// Copies the contiguous `chunk` (shape box.sizes) into its box of the contiguous `out`, row by row.
void copy_into(const Tensor& chunk, const dcp::Chunk& box, Tensor& out) {
  const size_t esize = dtype_size(out.dtype());
  const auto& shape = out.shape();
  const size_t nd = shape.size();
  const auto src = chunk.contiguous_bytes();
  auto dst = out.storage()->mutable_bytes();
  if (nd == 0) {
    std::memcpy(dst.data(), src.data(), esize);
    return;
  }
  const auto out_strides = Tensor::contiguous_strides(shape);
  const int64_t row = box.sizes[nd - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < nd; ++d) rows *= box.sizes[d];
  std::vector<int64_t> at(nd, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t o = box.offsets[nd - 1];
    for (size_t d = 0; d + 1 < nd; ++d) o += (box.offsets[d] + at[d]) * out_strides[d];
    std::memcpy(dst.data() + static_cast<size_t>(o) * esize, src.data() + static_cast<size_t>(r * row) * esize,
                static_cast<size_t>(row) * esize);
    for (size_t d = nd - 1; d-- > 0;) {  // next row index, last-but-one dimension fastest
      if (++at[d] < box.sizes[d]) break;
      at[d] = 0;
    }
  }
}

Tensor slice_of(const Tensor& stored, const std::vector<int64_t>& index) {
  Tensor t = stored;
  for (size_t d = 0; d < index.size(); ++d) t = t.narrow(static_cast<int64_t>(d), index[d], 1);
  return t.contiguous().reshape(std::vector<int64_t>(stored.shape().begin() + static_cast<std::ptrdiff_t>(index.size()),
                                                     stored.shape().end()));
}

}  // namespace

Tensor read_leading_slice(const dcp::Reader& reader, const std::string& fqn, const std::vector<int64_t>& index) {
  const auto& md = reader.metadata();
  const dcp::Entry* e = md.find(fqn);
  if (!e || e->is_bytes || e->size.size() < index.size())
    fail(md.path, "Megatron-Core torch_dist: no tensor " + escaped_brief(fqn) + " with " +
                      std::to_string(index.size()) + " leading axes");
  if (index.empty()) return reader.read_tensor(fqn);
  std::vector<size_t> which;
  const auto found = dcp::leading_sub_entry(*e, index, which);
  if (!found) return slice_of(reader.read_tensor(fqn), index);  // a chunk spans several layers
  const dcp::Entry& slice = *found;
  dcp::check_chunks_cover(slice, md.path);
  Tensor out = Tensor::zeros(e->dtype, slice.size);
  for (size_t i = 0; i < which.size(); ++i) copy_into(reader.read_chunk(fqn, which[i]).contiguous(), slice.chunks[i], out);
  return out;
}

}  // namespace ucpkit::formats::megatron_core
