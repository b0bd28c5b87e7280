// Minimal zip directory walk (EOCD, ZIP64 EOCD, central entries, local headers).
#include "pec/zip_records.h"


#include <algorithm>
#include <cstring>

#include "core/crc32.h"
#include "core/error.h"

namespace ucpkit::pec {
namespace {
uint64_t rd(std::span<const uint8_t> f, uint64_t off, int n, const std::string& name) {
  if (off + static_cast<uint64_t>(n) > f.size()) fail(name, "truncated zip directory");
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(f[off + i]) << (8 * i);
  return v;
}
void wr32(std::span<uint8_t> f, uint64_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) f[off + i] = static_cast<uint8_t>(v >> (8 * i));
}
}  // namespace

bool is_zip(std::span<const uint8_t> f) { return f.size() >= 4 && f[0] == 'P' && f[1] == 'K' && f[2] == 3 && f[3] == 4; }

std::map<std::string, ZipRecordPos> zip_records(std::span<const uint8_t> f, const std::string& name) {
  if (f.size() < 22) fail(name, "too small to be a zip file");
  uint64_t eocd = UINT64_MAX;
  uint64_t lowest = f.size() > 22 + 65535 ? f.size() - 22 - 65535 : 0;
  for (uint64_t p = f.size() - 22 + 1; p-- > lowest;)
    if (rd(f, p, 4, name) == 0x06054b50) {
      eocd = p;
      break;
    }
  if (eocd == UINT64_MAX) fail(name, "no end-of-central-directory record");
  uint64_t count = rd(f, eocd + 10, 2, name);
  uint64_t cd = rd(f, eocd + 16, 4, name);
  if ((cd == 0xFFFFFFFFu || count == 0xFFFF) && eocd >= 20 && rd(f, eocd - 20, 4, name) == 0x07064b50) {
    uint64_t z64 = rd(f, eocd - 20 + 8, 8, name);
    if (rd(f, z64, 4, name) != 0x06064b50) fail(name, "bad ZIP64 end-of-central-directory record");
    count = rd(f, z64 + 32, 8, name);
    cd = rd(f, z64 + 48, 8, name);
  }
  std::map<std::string, ZipRecordPos> out;
  uint64_t p = cd;
  for (uint64_t i = 0; i < count; ++i) {
    if (rd(f, p, 4, name) != 0x02014b50) fail(name, "bad central directory entry");
    ZipRecordPos r;
    r.central_entry = p;
    r.method = static_cast<uint16_t>(rd(f, p + 10, 2, name));
    uint64_t csize = rd(f, p + 20, 4, name), usize = rd(f, p + 24, 4, name);
    uint64_t nlen = rd(f, p + 28, 2, name), xlen = rd(f, p + 30, 2, name), clen = rd(f, p + 32, 2, name);
    uint64_t lho = rd(f, p + 42, 4, name);
    if (p + 46 + nlen > f.size()) fail(name, "truncated central directory");
    std::string entry(reinterpret_cast<const char*>(f.data() + p + 46), nlen);
    for (uint64_t x = p + 46 + nlen; x + 4 <= p + 46 + nlen + xlen;) {
      uint64_t id = rd(f, x, 2, name), len = rd(f, x + 2, 2, name);
      if (id == 0x0001) {
        uint64_t q = x + 4;
        if (usize == 0xFFFFFFFFu) usize = rd(f, q, 8, name), q += 8;
        if (csize == 0xFFFFFFFFu) csize = rd(f, q, 8, name), q += 8;
        if (lho == 0xFFFFFFFFu) lho = rd(f, q, 8, name), q += 8;
      }
      x += 4 + len;
    }
    if (rd(f, lho, 4, name) != 0x04034b50) fail(name, "bad local header for " + entry);
    r.local_header = lho;
    r.data_offset = lho + 30 + rd(f, lho + 26, 2, name) + rd(f, lho + 28, 2, name);
    r.size = usize;
    if (r.method != 0 || csize != usize) fail(name, "record " + entry + " is compressed; only stored zips are supported");
    if (r.data_offset + r.size > f.size()) fail(name, "record " + entry + " runs past the end of the file");
    out.emplace(std::move(entry), r);
    p += 46 + nlen + xlen + clen;
  }
  return out;
}

void store_zip_crc(uint64_t size, const ZipRecordPos& r, uint32_t crc, const std::function<void(uint64_t, size_t, uint8_t*)>& read,
                   const std::function<void(uint64_t, uint32_t)>& write) {
  write(r.central_entry + 16, crc);
  uint8_t flags[2];
  read(r.local_header + 6, 2, flags);
  if (flags[0] & 0x8) {
    // CRC and sizes follow the data in a data descriptor (torch.save writes them this way).
    uint64_t d = r.data_offset + r.size;
    uint8_t sig[4] = {0, 0, 0, 0};
    if (d + 4 <= size) read(d, 4, sig);
    if (d + 4 <= size && sig[0] == 0x50 && sig[1] == 0x4b && sig[2] == 0x07 && sig[3] == 0x08) d += 4;
    if (d + 4 <= size) write(d, crc);
  } else {
    write(r.local_header + 14, crc);
  }
}

void fix_zip_crc(std::span<uint8_t> f, const ZipRecordPos& r) {
  store_zip_crc(
      f.size(), r, crc32_parallel(f.subspan(r.data_offset, r.size)),
      [&](uint64_t off, size_t n, uint8_t* out) { std::copy_n(f.data() + off, n, out); },
      [&](uint64_t off, uint32_t v) { wr32(f, off, v); });
}

}  // namespace ucpkit::pec
