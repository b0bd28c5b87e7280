// Where each record of a stored (uncompressed) zip lives in the file, and how to fix its CRC-32 after
// its bytes were patched in place. Used to copy expert slices in and out of torch.save optimizer files
// without re-serializing them (so untouched bytes stay identical).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>

namespace ucpkit::pec {

struct ZipRecordPos {
  uint64_t data_offset = 0;
  uint64_t size = 0;
  uint64_t local_header = 0;  // offset of the local file header
  uint64_t central_entry = 0;  // offset of the central directory entry
  uint16_t method = 0;
};

// Full record name -> position. Throws Error (naming `name`) when the zip is malformed.
std::map<std::string, ZipRecordPos> zip_records(std::span<const uint8_t> file, const std::string& name);
bool is_zip(std::span<const uint8_t> file);
// Recomputes the CRC-32 of a record and writes it into its local header and central entry.
void fix_zip_crc(std::span<uint8_t> file, const ZipRecordPos& r);
// Writes a record's CRC-32 into a file of `file_size` bytes not held in memory: its central entry
// and its data descriptor (or local header), through `read(offset, n, out)` / `write(offset, crc)`.
void store_zip_crc(uint64_t file_size, const ZipRecordPos& r, uint32_t crc,
                   const std::function<void(uint64_t, size_t, uint8_t*)>& read,
                   const std::function<void(uint64_t, uint32_t)>& write);

}  // namespace ucpkit::pec
