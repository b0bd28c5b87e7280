// In-place rewrite of the ds_version string of a torch zip file.
#include "formats/deepspeed/shard_version.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/crc32.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "io/pickle/opcodes.h"
#include "io/zip/zip_records.h"

namespace ucpkit::formats::deepspeed {
namespace {

using pickle::Op;
using pickle::op_byte;

uint32_t le32(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24); }

// A pickled str at `p`: its text bounds, or false.
bool string_at(const std::vector<uint8_t>& b, size_t p, size_t& text, size_t& len) {
  if (p < b.size() && b[p] == op_byte(Op::BINUNICODE) && p + 5 <= b.size()) {
    text = p + 5;
    len = le32(&b[p + 1]);
  } else if (p < b.size() && b[p] == op_byte(Op::SHORT_BINUNICODE) && p + 2 <= b.size()) {
    text = p + 2;
    len = b[p + 1];
  } else {
    return false;
  }
  return text + len <= b.size();
}

}  // namespace

VersionPatch patch_ds_version(const std::string& path, const std::function<std::string(const std::string&)>& release_for) {
  VersionPatch out;
  ZipRecord pkl;
  uint64_t file_size = 0;
  {
    auto f = MappedFile::open(path);  // the directory and local headers only
    file_size = f->size();
    bool found = false;
    for (const auto& [name, r] : read_zip_directory(f->bytes(), path))
      if (name == "data.pkl" || (name.size() > 9 && name.compare(name.size() - 9, 9, "/data.pkl") == 0)) {
        pkl = r;
        found = true;
      }
    if (!found) fail(path, "torch zip without data.pkl");
  }
  const UniqueFd file = open_or_fail(path, O_RDWR);
  const int fd = file.get();
  {
    std::vector<uint8_t> b(pkl.size);
    pread_exact(fd, b.data(), b.size(), pkl.data_offset, path);
    static const char kKey[] = "ds_version";
    const size_t klen = sizeof kKey - 1;
    bool changed = false;
    for (size_t p = 0; p + klen <= b.size(); ++p) {
      size_t text = 0, len = 0;
      if (!string_at(b, p, text, len) || len != klen || std::memcmp(&b[text], kKey, klen) != 0) continue;
      size_t v = text + len;  // the value follows the key, after an optional memo put
      if (v < b.size() && b[v] == op_byte(Op::BINPUT)) v += 2;
      else if (v < b.size() && b[v] == op_byte(Op::LONG_BINPUT)) v += 5;
      else if (v < b.size() && b[v] == op_byte(Op::MEMOIZE)) v += 1;
      size_t vt = 0, vl = 0;
      if (!string_at(b, v, vt, vl)) continue;  // a memo reference to a string already seen, or not a str
      const std::string have(reinterpret_cast<const char*>(&b[vt]), vl);
      if (out.found.empty()) out.found = have;
      const std::string release = release_for(have);
      if (have == release) continue;
      if (vl != release.size()) {
        out.skipped = "its ds_version '" + have + "' has another length than '" + release + "' (left as saved)";
        continue;
      }
      std::memcpy(&b[vt], release.data(), vl);
      ++out.rewritten;
      changed = true;
      p = vt + vl - 1;
    }
    if (changed) {
      pwrite_all(fd, b.data(), b.size(), pkl.data_offset, path);
      store_zip_crc(
          file_size, pkl, crc32_parallel(b),
          [&](uint64_t off, size_t n, uint8_t* dst) { pread_exact(fd, dst, n, off, path); },
          [&](uint64_t off, uint32_t crc) {
            uint8_t le[4] = {static_cast<uint8_t>(crc), static_cast<uint8_t>(crc >> 8), static_cast<uint8_t>(crc >> 16),
                             static_cast<uint8_t>(crc >> 24)};
            pwrite_all(fd, le, 4, off, path);
          });
      if (::fsync(fd) != 0) fail(path, std::string("fsync failed: ") + std::strerror(errno));
    }
  }
  return out;
}

}  // namespace ucpkit::formats::deepspeed
