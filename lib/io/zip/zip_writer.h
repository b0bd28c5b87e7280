// Writer for torch.save's zip container: stored entries, data aligned to 64 bytes, CRC-32, ZIP64
// when sizes or offsets need it; written through an AtomicFile (temporary name, then rename).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ucpkit {

class AtomicFile;

class ZipWriter {
 public:
  // `start_writeback`: finish() starts the write-back of the finished file (sync_file_range WRITE, no
  // wait), so that a tool which flushes its output at the end (syncfs) overlaps the flush of each file
  // with the writing of the next instead of waiting for all of them at once.
  explicit ZipWriter(const std::string& path, bool durable = false, bool start_writeback = false);
  // A zip appended to `into` at its current offset, its offsets counted from there (a zip stored inside
  // a larger file: a DCP data item); finish() writes the central directory and leaves `into` open for
  // the caller to go on writing and commit.
  explicit ZipWriter(AtomicFile& into);
  // A zip appended to the string `*into` (offsets counted from its size at construction): add() and
  // finish() only, for bytes reused many times (TensorZipWriter's templates). A pointer: a string
  // argument is a path.
  explicit ZipWriter(std::string* into);
  ~ZipWriter();
  // Adds one record; `parts` are written back to back (no copy into one buffer).
  void add(const std::string& name, std::span<const uint8_t> data);
  void add(const std::string& name, const std::vector<std::span<const uint8_t>>& parts);
  // Adds one record of `size` bytes produced by `fill(offset, window)` window by window through one
  // reused buffer per thread (never the whole record in memory): each window is filled,
  // checksummed and written; the CRC-32 is patched into the local header at the end. `align` is
  // the element size: every window offset and size (but the last size) is a multiple of it.
  using Fill = std::function<void(uint64_t offset, std::span<uint8_t> window)>;
  void add_streamed(const std::string& name, uint64_t size, const Fill& fill, size_t align = 1);
  // Reserves one record of `size` bytes without writing it (the file is written out of order):
  // its bytes are given later with write_reserved (any order, several threads at once for
  // disjoint ranges) and its CRC-32 with set_crc, both before finish(). Returns the record's index.
  size_t reserve(const std::string& name, uint64_t size);
  // Adds one record of `size` zero bytes as a hole of the file (nothing written: the file system reads zeros back;
  // the CRC-32 computed, not summed over bytes).
  void add_zeros(const std::string& name, uint64_t size);
  void write_reserved(size_t record, uint64_t offset, std::span<const uint8_t> bytes);
  void set_crc(size_t record, uint32_t crc);
  // Writes out buffered bytes and frees the write buffer (a writer kept open while others work).
  void flush();
  // Window size used by add_streamed (bytes; default 8 MiB).
  static void set_stream_window(size_t bytes);
  // Writes the central directory and renames the file into place.
  void finish();

  // Where the record `name` lies, counted from the zip's first byte: its local header, its bytes and,
  // after finish(), its central directory entry (the CRC-32 fields: kLocalCrcField, kCentralCrcField).
  // Null when there is no such record.
  struct Place {
    uint64_t header = 0, data = 0, size = 0, directory = 0;
  };
  std::optional<Place> place(const std::string& name) const;

 private:
  // Writes the local header of a record starting at the current offset; returns that offset.
  uint64_t local_header(const std::string& name, uint64_t size, uint32_t crc);
  uint64_t here() const;                      // the offset the next byte goes to, counted from the zip's first
  void put(std::span<const uint8_t> bytes);  // to the file or the string
  AtomicFile& file();                         // the file; an error for a zip in memory
  struct Entry {
    std::string name;
    uint64_t header_offset, size;
    uint32_t crc;
    uint64_t data_offset = 0;  // reserved records: where their bytes go
    bool reserved = false;
    uint64_t data = 0, directory = 0;  // Place's: where its bytes and its central directory entry lie
  };
  std::unique_ptr<AtomicFile> out_;  // owned (a file of its own), or null
  AtomicFile* file_ = nullptr;       // where the bytes go: out_, or the file appended to
  std::string* mem_ = nullptr;       // or this string
  uint64_t base_ = 0;                // offset of the zip's first byte in *file_
  std::vector<Entry> entries_;
  bool start_writeback_ = false;
};

}  // namespace ucpkit
