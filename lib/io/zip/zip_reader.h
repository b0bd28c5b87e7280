// Reader for the zip container of torch.save files (stored entries, optional ZIP64), exposing each
// record as a byte range of the mapped file so storages can be used zero-copy.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "io/zip/zip_directory.h"

namespace ucpkit {

class MappedFile;

class ZipReader {
 public:
  // Parses the central directory; throws Error naming the file on any inconsistency.
  explicit ZipReader(std::shared_ptr<const MappedFile> file);

  // The common first path component of the records ("archive", or the file stem at save time).
  const std::string& prefix() const { return prefix_; }
  // Record by name relative to the prefix ("data.pkl", "data/0"); nullopt when absent.
  std::optional<ZipRecord> find(const std::string& relative_name) const;
  std::span<const uint8_t> bytes(const ZipRecord& r) const;
  const std::map<std::string, ZipRecord>& records() const { return records_; }
  // Recomputes the CRC-32 of a record and compares it with the directory (throws on mismatch).
  void verify_crc(const std::string& relative_name) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  std::string prefix_;
  std::map<std::string, ZipRecord> records_;  // full names
};

}  // namespace ucpkit
