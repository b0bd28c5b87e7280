// Lazy tensors: dtype, shape, strides and offset over a shared storage whose bytes live in a mapped
// file (zero-copy) or in memory. Views of one storage share it; data is touched only when asked.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/dtype.h"

namespace ucpkit {

class MappedFile;

// One storage (untyped bytes + element type), as torch.save writes one record per storage.
class Storage : public std::enable_shared_from_this<Storage> {
 public:
  // A storage backed by `nbytes` bytes at `offset` of a mapped file (nothing is read until bytes()).
  static std::shared_ptr<Storage> mapped(DType dtype, int64_t numel, std::shared_ptr<const MappedFile> file,
                                         uint64_t offset);
  // A storage owning its bytes (size must be numel * dtype_size).
  static std::shared_ptr<Storage> owned(DType dtype, std::vector<uint8_t> bytes);
  // A zero-filled owned storage.
  static std::shared_ptr<Storage> zeros(DType dtype, int64_t numel);
  // An owned storage whose bytes are not initialized: the caller fills all of mutable_bytes() before
  // anything reads them (a read buffer: zero-filling it first cost ucp-union a pass over every byte).
  static std::shared_ptr<Storage> uninitialized(DType dtype, int64_t numel);
  // Keeps the first `numel` elements of an owned storage (no copy; throws Error for other storages or
  // a larger count).
  void truncate(int64_t numel);
  // Fills `out` with the storage's bytes starting at byte `offset` (offset and size are multiples
  // of the element size; the range lies inside the storage).
  using Generator = std::function<void(uint64_t offset, std::span<uint8_t> out)>;
  // A storage whose bytes are produced on demand, window by window, by `fill`: only the writers
  // consume it (save_torch_file streams it through a small reused buffer); bytes() throws Error.
  static std::shared_ptr<Storage> generated(DType dtype, int64_t numel, Generator fill);
  // A generated storage of zeros that says so: writers that know it write a hole instead of its bytes (a fresh run's
  // optimizer moments, 8 of the 14 bytes per parameter a torch_dist import writes).
  static std::shared_ptr<Storage> zero_filled(DType dtype, int64_t numel);
  bool is_zero() const { return zero_; }

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  uint64_t nbytes() const { return static_cast<uint64_t>(numel_) * dtype_size(dtype_); }
  std::span<const uint8_t> bytes() const;
  // Writable bytes; only for owned storages (throws Error otherwise).
  std::span<uint8_t> mutable_bytes();
  bool is_mapped() const { return file_ != nullptr; }
  // A mapped storage's file and the byte offset of its first element there (nullptr and 0 for the others).
  const std::shared_ptr<const MappedFile>& mapped_file() const { return file_; }
  uint64_t mapped_offset() const { return offset_; }
  bool is_generated() const { return static_cast<bool>(generator_); }
  // Produces bytes [offset, offset + out.size()) of a generated storage (throws Error otherwise).
  void generate(uint64_t offset, std::span<uint8_t> out) const;
  // Binds a storage created without data to bytes of a mapped file (legacy torch files, whose
  // storages follow the pickle). Throws Error when the range does not fit the file.
  static std::shared_ptr<Storage> unbound(DType dtype, int64_t numel);
  void bind(std::shared_ptr<const MappedFile> file, uint64_t offset);
  bool is_bound() const { return file_ != nullptr || !unbound_; }

  // The same bytes read as another element type (torch >= 2.1 _rebuild_tensor_v3 gives an untyped
  // storage plus a dtype). Mapped or owned storages whose byte count the new element size divides;
  // throws Error otherwise. Returns this storage when the dtype is already `dtype`.
  std::shared_ptr<Storage> reinterpret(DType dtype);

  // Where the storage came from / should go: record key and device location ("cpu", "cuda:0").
  std::string key;
  std::string location = "cpu";
  // The CRC-32 of all of a mapped storage's bytes, when its reader checked them against the file's record: a writer
  // of the same bytes takes it instead of a second pass over them.
  std::optional<uint32_t> crc32;

 private:
  DType dtype_ = DType::Float32;
  int64_t numel_ = 0;
  std::shared_ptr<const MappedFile> file_;
  uint64_t offset_ = 0;
  std::vector<uint8_t> owned_;
  std::unique_ptr<uint8_t[]> uninitialized_;  // owned bytes of uninitialized(); owned_ stays empty
  bool unbound_ = false;
  bool zero_ = false;
  Generator generator_;
};

class Tensor {
 public:
  Tensor() = default;
  // A view; throws Error when the view does not fit in the storage.
  Tensor(std::shared_ptr<Storage> storage, int64_t storage_offset, std::vector<int64_t> shape,
         std::vector<int64_t> strides);
  // A new contiguous tensor owning `bytes` (size must match).
  static Tensor from_bytes(DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  template <typename T>
  static Tensor from_vector(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
    std::vector<uint8_t> b(values.size() * sizeof(T));
    if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
    return from_bytes(dtype, std::move(shape), std::move(b));
  }
  static Tensor zeros(DType dtype, std::vector<int64_t> shape);
  static std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

  DType dtype() const { return storage_ ? storage_->dtype() : DType::Float32; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t storage_offset() const { return offset_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const;
  uint64_t nbytes() const { return static_cast<uint64_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const;

  // The bytes of a contiguous tensor (zero-copy view into the storage). Throws if not contiguous.
  std::span<const uint8_t> contiguous_bytes() const;
  // Copies the elements in logical (row-major) order into `dst` (nbytes() bytes).
  void copy_to(void* dst) const;
  // A contiguous copy owning its bytes (or *this when already contiguous and `force_copy` is false).
  Tensor contiguous(bool force_copy = false) const;
  template <typename T>
  std::vector<T> to_vector() const {
    std::vector<T> out(static_cast<size_t>(numel()));
    copy_to(out.data());
    return out;
  }
  // Element-wise conversion between floating types (round to nearest even, as torch does).
  Tensor to(DType target) const;
  // A view of rows [start, start+length) along dimension `dim`.
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  // The same elements with a new shape: a view when contiguous, else a contiguous copy (as torch.reshape).
  Tensor reshape(std::vector<int64_t> shape) const;
  // Bitwise equality of dtype, shape and element bytes.
  bool equal(const Tensor& other) const;

  bool requires_grad = false;
  bool is_parameter = false;  // rebuilt through torch._utils._rebuild_parameter

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  std::vector<int64_t> shape_, strides_;
};

// Concatenation along `dim` into a new contiguous tensor (dtypes and other dims must match).
Tensor cat(const std::vector<Tensor>& parts, int64_t dim);

// `n` floating values from `in` (dtype `from`) to `out` (dtype `to`), each as Tensor::to converts it (buffers may be
// unaligned; Error for a dtype that is not floating).
void convert_floats(const uint8_t* in, DType from, uint8_t* out, DType to, size_t n);

}  // namespace ucpkit
