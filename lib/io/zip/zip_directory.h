// The directory of a zip file as torch.save writes it (stored records, optional ZIP64): where each
// record's bytes, local header and central entry lie. The one parser of zip headers, behind ZipReader
// (torch files read zero-copy) and pec's in-place patching of optimizer files (io/zip/zip_records).
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>

namespace ucpkit {

struct ZipRecord {
  uint64_t data_offset = 0;    // absolute offset of the record's bytes in the file
  uint64_t size = 0;
  uint32_t crc32 = 0;          // as the central directory records it
  uint64_t local_header = 0;   // offset of the local file header
  uint64_t central_entry = 0;  // offset of the central directory entry
};

// Where a record's CRC-32 lies in its local header and in its central directory entry.
constexpr uint64_t kLocalCrcField = 14, kCentralCrcField = 16;

// True when the bytes start like a zip archive (a local file header).
bool looks_like_zip(std::span<const uint8_t> head);

// Full record name -> record, from the end-of-central-directory record (ZIP64 when its fields
// overflow), the central entries (ZIP64 extra fields) and the local headers, every field
// bounds-checked against `file`. Throws Error naming `path` on any inconsistency, on a compressed
// record (torch files store their records uncompressed) and on a name given twice.
std::map<std::string, ZipRecord> read_zip_directory(std::span<const uint8_t> file, const std::string& path);

}  // namespace ucpkit
