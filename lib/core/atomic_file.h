// Crash-safe output: write to a temporary name beside the target, fsync, then rename into place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>

namespace ucpkit {

// A file being written to `<target>.tmp.<pid>.<n>`; commit() renames it to the target, the
// destructor removes it when commit() was never reached (error or exception).
class AtomicFile {
 public:
  // `bypass`: a large file written front to back that nothing reads back soon (moe-replace's plan,
  // hundreds of MB at 1,024 nodes) goes to the disk with O_DIRECT in aligned 4 MiB blocks, not
  // through the page cache: copying it into the cache cost the kernel about 1 s of CPU per 400 MB
  // here, O_DIRECT about 0.05 s. Where the file system refuses O_DIRECT the file is written as usual.
  // Anything but write() (skip, pwrite_at, flush, start_writeback, commit) first writes what is
  // buffered and goes on without it; a pwrite_at inside the block being filled (a zip record's CRC
  // after its data) is patched there and keeps it. Full blocks are written in order by a thread of the file's
  // own while the next ones are filled, up to three waiting (two blocks a file, the rest from a few shared by the
  // process): the disk's time and the caller's overlap, and the disk is kept busy through the caller's stalls.
  enum class Cache { keep, bypass };
  explicit AtomicFile(std::string target, bool durable = false, Cache cache = Cache::keep);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(std::span<const uint8_t> bytes) { write(bytes.data(), bytes.size()); }
  // With O_DIRECT on (Cache::bypass), the next `want` bytes (or fewer: up to the end of the block being
  // filled) as a span to fill in place, then taken with filled(): bytes made there skip one copy through a
  // buffer of the caller's. Empty when O_DIRECT is off or the room left in the block is not a multiple of
  // `align`: write() then.
  std::span<uint8_t> room(size_t want, size_t align = 1);
  void filled(size_t n);  // the first `n` bytes of room() are written
  // Writes `n` zero bytes (padding).
  void write_zeros(size_t n);
  // Leaves `n` bytes unwritten (a hole that reads as zeros) to be filled later with pwrite_at.
  void skip(uint64_t n);
  // Overwrites bytes already written (or skipped) at `offset` (e.g. a header field known only
  // afterwards); the range must lie before offset(). Throws Error otherwise or when the write fails.
  // Safe from several threads at once for disjoint ranges that are no longer buffered (skipped
  // ranges never are) while no other member function runs.
  void pwrite_at(uint64_t offset, std::span<const uint8_t> bytes);
  uint64_t offset() const { return offset_; }
  // Writes out buffered bytes; frees the buffer unless `keep_buffer` (files kept open for a long time
  // free it; a crash point that must find the bytes so far in the file keeps it for the writes after).
  void flush(bool keep_buffer = false);
  // Flushes the buffer and starts the write-back of the file to the disk without waiting for it
  // (sync_file_range): a later fsync of the file or syncfs finds little left to do.
  void start_writeback();
  void commit();
  // commit() under another name, in the same file system (a content-addressed store: the name is
  // known only once the bytes are written).
  void commit_as(std::string target);
  const std::string& target() const { return target_; }

 private:
  void flush_buffer();
  void write_direct(const char* data, size_t n);
  bool direct_block();  // writes the full direct buffer with O_DIRECT; false when the file system refused
  void leave_direct();  // the direct buffer written out, O_DIRECT off for good
  void submit_block();  // the full direct block to the writing thread, another block to fill next
  void settle();        // waits for the blocks queued; what could not go direct goes through the cache, O_DIRECT ends
  void direct_off();    // O_DIRECT cleared on the descriptor (the rest through the cache)
  std::string target_, temp_;
  int fd_ = -1;
  bool durable_;
  bool committed_ = false;
  uint64_t offset_ = 0;
  std::string buffer_;
  char* direct_ = nullptr;  // Cache::bypass while O_DIRECT is on: the aligned block being filled
  size_t direct_used_ = 0;
  class Writer;                     // the thread writing full blocks, and the blocks (atomic_file.cpp)
  std::unique_ptr<Writer> writer_;  // from the first full block until settle()
};

// Writes a whole file atomically (`cache`: AtomicFile's, for a large file the run does not read back).
void write_file_atomic(const std::string& path, std::string_view contents, bool durable = false,
                       AtomicFile::Cache cache = AtomicFile::Cache::keep);
// Refuses, before a run writes anything, a file it would write last (a report beside the output): Error
// naming `path` when its folder does not exist, is no folder or is not writable, or `path` is a folder.
void check_file_target(const std::string& path);
// Reads a whole small file; throws Error naming the file and `what` it is (a FIFO or device is
// refused without blocking: open_input).
std::string read_text_file(const std::string& path, const std::string& what = "input");
// Copies the file `from` to `to` (created or truncated, mode 0644). Throws Error naming `to` with the
// real errno text of a failed read or write ("No space left on device"; std::filesystem::copy_file
// reports a short sendfile as EIO whatever the cause).
void copy_file_contents(const std::string& from, const std::string& to);
// fsyncs a directory so a rename inside it is durable.
void fsync_dir(const std::string& dir);

}  // namespace ucpkit
