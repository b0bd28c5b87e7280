// A read-only memory map of a whole file, shared by every view (storage, record) cut from it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace ucpkit {

class MappedFile {
 public:
  // Maps `path` read-only; throws Error naming the file when it cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  // Wraps bytes already in memory (fuzzing, tests); the bytes are copied.
  static std::shared_ptr<const MappedFile> from_bytes(std::span<const uint8_t> bytes, std::string name);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }
  // Tells the kernel a range will be read soon / sequentially (no-op for in-memory files).
  void will_need(size_t offset, size_t length) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  std::unique_ptr<uint8_t[]> owned_;
  std::string path_;
};

}  // namespace ucpkit
