// One object file of the PEC store (docs/pec.md): a 32-byte header (magic "UCPKOBJ1", raw size, digest
// hi, digest lo; little-endian) followed by one zstd frame (with zstd's own content checksum), or, with
// zstd level 0, magic "UCPKOBJ0" followed by the bytes as they are. The header's writer and reader, and
// ObjectReader, which streams an object's raw bytes out of its file.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"
#include "core/file_io.h"

namespace ucpkit::formats {

// A missing or damaged object (restore falls back to another copy when it can).
class ObjectError : public Error {
 public:
  using Error::Error;
};

inline constexpr char kObjectMagicZstd[8] = {'U', 'C', 'P', 'K', 'O', 'B', 'J', '1'};
inline constexpr char kObjectMagicRaw[8] = {'U', 'C', 'P', 'K', 'O', 'B', 'J', '0'};
inline constexpr size_t kObjectHeader = 32;

struct ObjectHeader {
  bool stored = false;    // "UCPKOBJ0": the raw bytes follow as they are; else one zstd frame
  uint64_t raw_size = 0;  // bytes of the object (uncompressed)
  uint64_t digest_hi = 0, digest_lo = 0;  // the store's 128-bit digest of the raw bytes (pec/checksum.h)

  std::array<uint8_t, kObjectHeader> encode() const;
  // The header at the start of object file `path` (`head`: its first bytes, fewer when the file is
  // shorter); throws ObjectError "<path>: not a PEC object (bad header)" when they are not one.
  static ObjectHeader parse(std::span<const uint8_t> head, const std::string& path);
};

// Streams the raw bytes of one object file: the header, then the payload decompressed window by
// window into `consume` (zstd's own checksum is skipped: the store's digest, which the caller
// computes on the way, covers the same bytes). One reader per thread, reused across objects.
class ObjectReader {
 public:
  // Memory one reader holds: an input block, an output window and a zstd decoder (<= 8 MiB window
  // for levels up to 19).
  static constexpr size_t kInBlock = size_t{1} << 20, kWindow = size_t{4} << 20;
  static constexpr uint64_t kMemory = kInBlock + kWindow + (uint64_t{9} << 20);

  ObjectReader();
  ~ObjectReader();
  ObjectReader(const ObjectReader&) = delete;
  ObjectReader& operator=(const ObjectReader&) = delete;

  // Opens object file `path` and reads its header; throws ObjectError when it is missing, unreadable
  // or has no PEC object header.
  ObjectHeader open(const std::string& path);
  // Passes the raw bytes of the object opened last to `consume` in order (at most kWindow bytes at a time);
  // throws ObjectError when the payload is corrupt: a damaged or truncated zstd frame, bytes after it,
  // or a size other than the header's.
  void read(const std::function<void(const uint8_t*, size_t)>& consume);

 private:
  struct Buffers;
  std::unique_ptr<Buffers> b_;
  std::string path_;
  UniqueFd in_;
  ObjectHeader header_;
};

}  // namespace ucpkit::formats
