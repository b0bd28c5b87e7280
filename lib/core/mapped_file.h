// A read-only memory map of a whole file, shared by every view (storage, record) cut from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

namespace ucpkit {

class MappedFile {
 public:
  // Maps `path` read-only; throws Error naming the file when it cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  // Wraps bytes already in memory (fuzzing, tests); the bytes are copied.
  static std::shared_ptr<const MappedFile> from_bytes(std::span<const uint8_t> bytes, std::string name);
  // Bytes [offset, offset + length) of `parent` as a file of their own, not copied (a torch.save zip
  // stored inside a larger file: DCP data items); keeps `parent` mapped. Throws Error naming `name`
  // when the range does not fit; an empty `name` is the parent's (its path() is the parent's path).
  // With `drop_when_released`, the slice's pages are dropped from the process (drop_pages) when the slice goes: a
  // view that a writer copies from, whose pages are done with once its last storage is written.
  static std::shared_ptr<const MappedFile> slice(std::shared_ptr<const MappedFile> parent, size_t offset,
                                                 size_t length, std::string name, bool drop_when_released = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_.empty() && parent_ ? parent_->path() : path_; }
  // Tells the kernel a range will be read soon / sequentially (no-op for in-memory files).
  void will_need(size_t offset, size_t length) const;
  // Maps a range's pages in one call (MADV_POPULATE_READ) ahead of a sequential read: a fault per 64 KB
  // otherwise. Nothing on kernels without it.
  void prefault(size_t offset, size_t length) const;
  // Drops the pages wholly inside `bytes` from this process's resident set when `bytes` lies in a live
  // file mapping of this process (read once and checked: a later read faults them back from the page
  // cache); does nothing for any other memory.
  static void done_with(std::span<const uint8_t> bytes);
  // Drops the pages `bytes` touches (neighbours' shared pages too; `bytes` inside this file's map, else nothing)
  // from this process's resident set, small ranges gathered: they wait until those waiting span kDropBatch bytes
  // (or the next one lies farther away), then one madvise drops them all. Every madvise makes the process's other
  // threads flush their TLBs: one per 1.6-KB item of a 100,000-tensor DCP was a fifth of its rewrite's CPU. A page
  // still being read elsewhere is faulted back in from the page cache (the map is private and read-only).
  void drop_pages(std::span<const uint8_t> bytes) const;
  static constexpr size_t kDropBatch = size_t{32} << 20;

  // A mapped file that shrinks while it is read (another job rewriting a checkpoint, a network file
  // system) raises SIGBUS on the first access past its new end. The first mapping installs a SIGBUS
  // handler that, for an address inside a live mapping, maps zero pages over the rest of that mapping
  // and records the file, so the read goes on (on zeros) instead of killing the tool. Every commit of
  // an output (StagingDir::commit, AtomicFile::commit) calls check_inputs_intact() first, which
  // throws Error naming the file: nothing read from a shrunken file is ever committed. A SIGBUS at
  // any other address keeps its previous disposition.
  static void check_inputs_intact();

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  int slot_ = -1;  // its entry in the SIGBUS guard's table (-1: not guarded)
  std::unique_ptr<uint8_t[]> owned_;
  std::shared_ptr<const MappedFile> parent_;  // slices
  bool drop_when_released_ = false;           // a slice whose pages go with it
  mutable std::mutex drop_mu_;
  mutable uintptr_t drop_lo_ = 0, drop_hi_ = 0;  // drop_pages' range waiting (empty when equal)
  std::string path_;
};

}  // namespace ucpkit
