// Element ranges of one DCP tensor (or of its sub-tensor at fixed leading indices: a layer of a
// Megatron-Core stacked key), copied straight from the data files into the caller's buffer: no tensor
// is assembled, nothing is mapped but each item's small records. Each range is read with pread (one
// copy out of the page cache, as `dd` reads) from the runs of bytes the chunks lay into the row-major
// tensor. For a reader that hands every element out once in any order (ucp-load's torch_dist one pass):
// memory holds no state, whatever the tensor's size.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "formats/dcp/reader.h"

namespace ucpkit::formats::dcp {

class RangeReader {
 public:
  // Tensor `fqn` of `reader`, or its sub-tensor at leading indices `index` (empty: the whole tensor).
  // The reader must outlive the RangeReader (its data files' descriptors are the reader's).
  // Null where the chunks do not suit: a chunk spanning several of the leading indices (read the whole
  // tensor instead). Throws Error naming the file as read_tensor / read_leading_slice do: no such tensor,
  // chunks that do not tile the (sub-)tensor, an item that does not decode.
  static std::unique_ptr<RangeReader> open(const Reader& reader, const std::string& fqn,
                                           const std::vector<int64_t>& index = {});
  ~RangeReader();
  RangeReader(const RangeReader&) = delete;
  RangeReader& operator=(const RangeReader&) = delete;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }

  // Copies elements [begin, begin + n) of the row-major (sub-)tensor into `dst` (n * element size
  // bytes). Thread-safe. Throws Error naming the data file when a read fails or comes short.
  void copy(int64_t begin, int64_t n, uint8_t* dst);
  // Under --verify, checks every chunk's data-record CRC-32 (Error naming the item): the CRC-32s of the
  // ranges copied, combined in order, and the bytes never asked for (a padded vocabulary's last rows)
  // read now. Call once every range has been copied; each byte must have been copied at most once.
  void finish();
  // Under --verify, checks every chunk's data-record CRC-32 now, summed where the bytes lie in a map of the data file
  // (no copy into a buffer: a separate check pass by copy() cost a torch_dist export a third of its time), then
  // forgets the CRC-32s: later copies sum nothing and finish() has nothing left. Error naming the item.
  void check_now();
  // Forgets the CRC-32s unchecked: another reader of the same items has checked them (check_now).
  void trust();

 private:
  RangeReader() = default;
  struct Run {
    uint64_t at = 0;     // byte offset in the (sub-)tensor
    uint64_t len = 0;
    uint32_t chunk = 0;
    uint64_t from = 0;   // byte offset in the chunk
  };
  struct Segment {
    uint64_t from = 0, len = 0;
    uint32_t crc = 0;
  };
  void read_chunk_bytes(uint32_t chunk, uint64_t from, uint64_t len, uint8_t* dst) const;

  DType dtype_ = DType::Float32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::string metadata_;
  const Reader* reader_ = nullptr;       // outlives this (open's contract): its data files' descriptors and maps
  std::vector<ChunkBytes> chunks_;
  std::vector<int> fds_;                 // [chunk] the data file's descriptor (the Reader's), -1 for bytes in memory
  std::vector<Run> runs_;                // sorted by `at`, tiling the (sub-)tensor
  std::mutex mu_;
  bool finished_ = false;
  std::vector<std::vector<Segment>> copied_;  // [chunk] CRC-32s of the ranges copied (chunks with a CRC to check)
};

}  // namespace ucpkit::formats::dcp
