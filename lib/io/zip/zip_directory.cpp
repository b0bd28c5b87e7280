// Zip directory parser (stored records only, ZIP64 aware), bounds-checked against the file.
#include "io/zip/zip_directory.h"

#include "core/error.h"

namespace ucpkit {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50, kEnd64LocatorSig = 0x07064b50;

struct Cursor {
  std::span<const uint8_t> d;
  const std::string& path;
  uint64_t get(uint64_t off, int n) const {
    if (off > d.size() || static_cast<uint64_t>(n) > d.size() - off)
      fail(path, "zip: damaged directory (field at byte " + std::to_string(off) + " past the end of the file)");
    uint64_t v = 0;
    for (int k = 0; k < n; ++k) v |= static_cast<uint64_t>(d[off + k]) << (8 * k);
    return v;
  }
};

struct Directory {
  uint64_t entries = 0, size = 0, offset = 0;
};

// The end-of-central-directory record lies in the last 64 KiB + 22 bytes; its ZIP64 twin, found
// through the locator before it, holds the fields that overflow.
Directory find_directory(const Cursor& c) {
  const uint64_t size = c.d.size();
  if (size < 22) fail(c.path, "zip: file too short for an end-of-directory record (truncated?)");
  uint64_t eocd = UINT64_MAX;
  const uint64_t lowest = size > 65557 ? size - 65557 : 0;
  for (uint64_t p = size - 22 + 1; p-- > lowest;) {
    if (c.get(p, 4) == kEndSig) {
      eocd = p;
      break;
    }
  }
  if (eocd == UINT64_MAX) fail(c.path, "zip: end of central directory not found (truncated or not a zip file)");
  Directory dir{c.get(eocd + 10, 2), c.get(eocd + 12, 4), c.get(eocd + 16, 4)};
  if (dir.entries == 0xFFFF || dir.size == 0xFFFFFFFF || dir.offset == 0xFFFFFFFF) {
    if (eocd < 20 || c.get(eocd - 20, 4) != kEnd64LocatorSig) fail(c.path, "zip: ZIP64 locator missing");
    const uint64_t z64 = c.get(eocd - 20 + 8, 8);
    if (c.get(z64, 4) != kEnd64Sig) fail(c.path, "zip: ZIP64 end of directory record damaged");
    dir = {c.get(z64 + 32, 8), c.get(z64 + 40, 8), c.get(z64 + 48, 8)};
  }
  if (dir.offset > size || dir.size > size - dir.offset) fail(c.path, "zip: central directory lies outside the file");
  if (dir.entries > dir.size / 46)
    fail(c.path, "zip: entry count " + std::to_string(dir.entries) + " does not fit the directory");
  return dir;
}

}  // namespace

bool looks_like_zip(std::span<const uint8_t> head) {
  return head.size() >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4;
}

std::map<std::string, ZipRecord> read_zip_directory(std::span<const uint8_t> file, const std::string& path) {
  const Cursor c{file, path};
  const Directory dir = find_directory(c);
  const uint64_t dir_end = dir.offset + dir.size;
  std::map<std::string, ZipRecord> records;
  uint64_t p = dir.offset;
  for (uint64_t k = 0; k < dir.entries; ++k) {
    if (c.get(p, 4) != kCentralSig) fail(path, "zip: damaged central directory entry " + std::to_string(k));
    const uint64_t method = c.get(p + 10, 2);
    const auto crc = static_cast<uint32_t>(c.get(p + kCentralCrcField, 4));
    uint64_t csize = c.get(p + 20, 4), usize = c.get(p + 24, 4);
    const uint64_t name_len = c.get(p + 28, 2), extra_len = c.get(p + 30, 2), comment_len = c.get(p + 32, 2);
    uint64_t lho = c.get(p + 42, 4);
    if (p + 46 + name_len > dir_end) fail(path, "zip: entry name runs past the directory");
    std::string name(reinterpret_cast<const char*>(file.data() + p + 46), static_cast<size_t>(name_len));
    // ZIP64 extra field: only the fields set to 0xFFFFFFFF are present, in this order.
    uint64_t e = p + 46 + name_len;
    const uint64_t e_end = e + extra_len;
    if (e_end > dir_end) fail(path, "zip: entry extra field runs past the directory");
    while (e + 4 <= e_end) {
      const uint64_t id = c.get(e, 2), len = c.get(e + 2, 2);
      if (e + 4 + len > e_end) fail(path, "zip: damaged extra field in entry '" + name + "'");
      if (id == 0x0001) {
        uint64_t q = e + 4;
        const uint64_t q_end = e + 4 + len;
        auto take = [&](uint64_t& field) {
          if (field != 0xFFFFFFFF) return;
          if (q + 8 > q_end) fail(path, "zip: short ZIP64 field in entry '" + name + "'");
          field = c.get(q, 8);
          q += 8;
        };
        take(usize);
        take(csize);
        take(lho);
      }
      e += 4 + len;
    }
    if (method != 0)
      fail(path, "zip: record '" + name + "' is compressed (method " + std::to_string(method) +
                     "); torch files store records uncompressed");
    if (csize != usize) fail(path, "zip: record '" + name + "' has inconsistent sizes");
    if (c.get(lho, 4) != kLocalSig) fail(path, "zip: local header of '" + name + "' is damaged");
    const uint64_t data = lho + 30 + c.get(lho + 26, 2) + c.get(lho + 28, 2);
    if (data > file.size() || usize > file.size() - data)
      fail(path, "zip: record '" + name + "' runs past the end of the file");
    // Two records of one name: which one a reader takes is not defined (torch never writes this).
    if (!records.emplace(name, ZipRecord{data, usize, crc, lho, p}).second)
      fail(path, "zip: record '" + name + "' appears twice in the central directory");
    p = e_end + comment_len;
  }
  return records;
}

}  // namespace ucpkit
