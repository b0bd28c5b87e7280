// Writer for torch.save's zip container: stored entries, data aligned to 64 bytes, CRC-32, ZIP64
// when sizes or offsets need it; written through an AtomicFile (temporary name, then rename).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ucpkit {

class AtomicFile;

class ZipWriter {
 public:
  explicit ZipWriter(const std::string& path, bool durable = false);
  ~ZipWriter();
  // Adds one record; `parts` are written back to back (no copy into one buffer).
  void add(const std::string& name, std::span<const uint8_t> data);
  void add(const std::string& name, const std::vector<std::span<const uint8_t>>& parts);
  // Writes the central directory and renames the file into place.
  void finish();

 private:
  struct Entry {
    std::string name;
    uint64_t header_offset, size;
    uint32_t crc;
  };
  std::unique_ptr<AtomicFile> out_;
  std::vector<Entry> entries_;
};

}  // namespace ucpkit
