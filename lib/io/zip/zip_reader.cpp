// Zip container reader (stored records only, ZIP64 aware), bounds-checked against the file.
#include "io/zip/zip_reader.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/mapped_file.h"
#include "core/crc32.h"

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

}  // namespace

bool ZipReader::looks_like_zip(std::span<const uint8_t> head) {
  return head.size() >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4;
}

ZipReader::ZipReader(std::shared_ptr<const MappedFile> file) : file_(std::move(file)) {
  const std::string& path = file_->path();
  Cursor c{file_->bytes(), path};
  const uint64_t size = file_->size();
  if (size < 22) fail(path, "zip: file too short for an end-of-directory record (truncated?)");

  // The end-of-central-directory record is in the last 64 KiB + 22 bytes.
  uint64_t eocd = UINT64_MAX;
  uint64_t lowest = size > 65557 ? size - 65557 : 0;
  for (uint64_t p = size - 22 + 1; p-- > lowest;) {
    if (c.get(p, 4) == kEndSig) {
      eocd = p;
      break;
    }
  }
  if (eocd == UINT64_MAX) fail(path, "zip: end of central directory not found (truncated or not a zip file)");

  uint64_t entries = c.get(eocd + 10, 2);
  uint64_t cd_size = c.get(eocd + 12, 4);
  uint64_t cd_offset = c.get(eocd + 16, 4);
  if (entries == 0xFFFF || cd_size == 0xFFFFFFFF || cd_offset == 0xFFFFFFFF) {
    if (eocd < 20 || c.get(eocd - 20, 4) != kEnd64LocatorSig) fail(path, "zip: ZIP64 locator missing");
    uint64_t z64 = c.get(eocd - 20 + 8, 8);
    if (c.get(z64, 4) != kEnd64Sig) fail(path, "zip: ZIP64 end of directory record damaged");
    entries = c.get(z64 + 32, 8);
    cd_size = c.get(z64 + 40, 8);
    cd_offset = c.get(z64 + 48, 8);
  }
  if (cd_offset > size || cd_size > size - cd_offset) fail(path, "zip: central directory lies outside the file");
  if (entries > cd_size / 46) fail(path, "zip: entry count " + std::to_string(entries) + " does not fit the directory");

  uint64_t p = cd_offset;
  for (uint64_t k = 0; k < entries; ++k) {
    if (c.get(p, 4) != kCentralSig) fail(path, "zip: damaged central directory entry " + std::to_string(k));
    uint64_t method = c.get(p + 10, 2);
    uint32_t crc = static_cast<uint32_t>(c.get(p + 16, 4));
    uint64_t csize = c.get(p + 20, 4), usize = c.get(p + 24, 4);
    uint64_t name_len = c.get(p + 28, 2), extra_len = c.get(p + 30, 2), comment_len = c.get(p + 32, 2);
    uint64_t lho = c.get(p + 42, 4);
    if (p + 46 + name_len > cd_offset + cd_size) fail(path, "zip: entry name runs past the directory");
    std::string name(reinterpret_cast<const char*>(file_->data() + p + 46), static_cast<size_t>(name_len));
    // ZIP64 extra field: only the fields set to 0xFFFFFFFF are present, in this order.
    uint64_t e = p + 46 + name_len, e_end = e + extra_len;
    if (e_end > cd_offset + cd_size) fail(path, "zip: entry extra field runs past the directory");
    while (e + 4 <= e_end) {
      uint64_t id = c.get(e, 2), len = c.get(e + 2, 2);
      if (e + 4 + len > e_end) fail(path, "zip: damaged extra field in entry '" + name + "'");
      if (id == 0x0001) {
        uint64_t q = e + 4, q_end = e + 4 + len;
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
    if (method != 0) fail(path, "zip: record '" + name + "' is compressed (method " + std::to_string(method) +
                                    "); torch files store records uncompressed");
    if (csize != usize) fail(path, "zip: record '" + name + "' has inconsistent sizes");
    if (c.get(lho, 4) != kLocalSig) fail(path, "zip: local header of '" + name + "' is damaged");
    uint64_t data = lho + 30 + c.get(lho + 26, 2) + c.get(lho + 28, 2);
    if (data > size || usize > size - data) fail(path, "zip: record '" + name + "' runs past the end of the file");
    records_[name] = ZipRecord{data, usize, crc};
    p = e_end + comment_len;
  }

  // The archive prefix is the folder holding data.pkl (any name: it is the file stem at save time).
  for (const auto& [name, rec] : records_) {
    auto slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      prefix_ = name.substr(0, slash);
      break;
    }
  }
  if (prefix_.empty() && !records_.count("data.pkl")) fail(path, "zip: no data.pkl record (not a torch file?)");
}

std::optional<ZipRecord> ZipReader::find(const std::string& relative_name) const {
  auto it = records_.find(prefix_.empty() ? relative_name : prefix_ + "/" + relative_name);
  if (it == records_.end()) return std::nullopt;
  return it->second;
}

std::span<const uint8_t> ZipReader::bytes(const ZipRecord& r) const {
  return file_->bytes().subspan(static_cast<size_t>(r.data_offset), static_cast<size_t>(r.size));
}

void ZipReader::verify_crc(const std::string& relative_name) const {
  auto r = find(relative_name);
  if (!r) fail(file_->path(), "zip: no record '" + relative_name + "'");
  if (crc32_parallel(bytes(*r)) != r->crc32) fail(file_->path(), "zip: CRC-32 mismatch in record '" + relative_name + "'");
}

}  // namespace ucpkit
