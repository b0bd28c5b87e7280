// Zip CRC-32 check from pieces already checksummed plus pread of the rest (see zip_crc_check.h).
#include "io/zip/zip_crc_check.h"

#include <fcntl.h>

#include <algorithm>
#include <memory>

#include "core/crc32.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "io/zip/zip_reader.h"

namespace ucpkit {

uint64_t check_zip_crcs(const std::string& path, std::vector<KnownCrc> known) {
  auto file = MappedFile::open(path);
  if (!looks_like_zip(file->bytes())) return 0;
  ZipReader zip(file);
  const UniqueFd f = open_input(path, "checkpoint file");
  // Longest first among pieces starting at the same byte: the shorter ones are then inside it.
  std::sort(known.begin(), known.end(), [](const KnownCrc& a, const KnownCrc& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.size > b.size;
  });
  constexpr uint64_t kWindow = 8ull << 20;
  std::unique_ptr<uint8_t[]> buf;
  uint64_t read_bytes = 0;
  // CRC-32 of [a, b) read from the file.
  auto read_crc = [&](uint64_t a, uint64_t b) {
    if (!buf) buf = std::make_unique_for_overwrite<uint8_t[]>(kWindow);
    uint32_t crc = 0;
    while (a < b) {
      const size_t n = static_cast<size_t>(std::min(kWindow, b - a));
      pread_exact(f.get(), buf.get(), n, a, path);  // past the end: the file shrank while read
      crc = crc32_parallel({buf.get(), n}, crc);
      a += n;
      read_bytes += n;
    }
    return crc;
  };
  std::vector<std::pair<std::string, ZipRecord>> records(zip.records().begin(), zip.records().end());
  std::sort(records.begin(), records.end(),
            [](const auto& a, const auto& b) { return a.second.data_offset < b.second.data_offset; });
  auto it = known.begin();
  for (const auto& [name, rec] : records) {
    const uint64_t begin = rec.data_offset, end = rec.data_offset + rec.size;
    uint64_t at = begin;
    uint32_t crc = 0;
    auto add = [&](uint32_t c, uint64_t n) { crc = at == begin ? c : crc32_combine(crc, c, n); at += n; };
    while (it != known.end() && it->offset + it->size <= begin) ++it;  // pieces before this record
    for (; it != known.end() && it->offset < end; ++it) {
      const uint64_t lo = it->offset, hi = it->offset + it->size;
      if (lo < begin || hi > end) continue;  // not inside this record (never made so): ignored
      if (hi <= at) continue;                // already accounted for
      if (lo > at) add(read_crc(at, lo), lo - at);
      if (lo == at) {
        add(it->crc, it->size);
      } else {  // starts inside bytes already accounted for: its CRC cannot be split
        add(read_crc(at, hi), hi - at);
      }
    }
    if (at < end) add(read_crc(at, end), end - at);
    if (crc != rec.crc32)
      fail(path, "zip: CRC-32 mismatch in record '" + name + "' (the file is damaged; --no-verify skips this check)");
  }
  return read_bytes;
}

}  // namespace ucpkit
