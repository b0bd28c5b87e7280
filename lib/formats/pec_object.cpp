// PEC object files: header encoding and the streaming read of their payload.
#include "formats/pec_object.h"

#include <fcntl.h>
#include <sys/stat.h>
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_d_forceIgnoreChecksum
#include <zstd.h>

#include <cerrno>
#include <cstring>

namespace ucpkit::formats {
namespace {

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::array<uint8_t, kObjectHeader> ObjectHeader::encode() const {
  std::array<uint8_t, kObjectHeader> h{};
  std::memcpy(h.data(), stored ? kObjectMagicRaw : kObjectMagicZstd, 8);
  put_u64(h.data() + 8, raw_size);
  put_u64(h.data() + 16, digest_hi);
  put_u64(h.data() + 24, digest_lo);
  return h;
}

ObjectHeader ObjectHeader::parse(std::span<const uint8_t> head, const std::string& path) {
  ObjectHeader h;
  h.stored = head.size() >= kObjectHeader && std::memcmp(head.data(), kObjectMagicRaw, 8) == 0;
  if (head.size() < kObjectHeader || (!h.stored && std::memcmp(head.data(), kObjectMagicZstd, 8) != 0))
    throw ObjectError(path + ": not a PEC object (bad header)");
  h.raw_size = get_u64(head.data() + 8);
  h.digest_hi = get_u64(head.data() + 16);
  h.digest_lo = get_u64(head.data() + 24);
  return h;
}

struct ObjectReader::Buffers {
  std::unique_ptr<uint8_t[]> in{new uint8_t[kInBlock]};
  std::unique_ptr<uint8_t[]> out{new uint8_t[kWindow]};
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx{ZSTD_createDCtx(), ZSTD_freeDCtx};
  Buffers() {
    // zstd's own content checksum would hash every byte a third time: the object digest computed
    // on the way covers the same bytes with 128 bits.
    ZSTD_DCtx_setParameter(dctx.get(), ZSTD_d_forceIgnoreChecksum, ZSTD_d_ignoreChecksum);
  }
};

ObjectReader::ObjectReader() : b_(std::make_unique<Buffers>()) {}
ObjectReader::~ObjectReader() = default;

ObjectHeader ObjectReader::open(const std::string& path) {
  path_ = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) throw ObjectError(path + ": object missing");
  try {
    in_ = open_input(path, "PEC object");  // a FIFO in the store is refused, not waited on
  } catch (const Error& e) {
    throw ObjectError(e.what());
  }
  uint8_t head[kObjectHeader];
  const ssize_t got = pread_some(in_.get(), head, kObjectHeader, 0);
  header_ = ObjectHeader::parse({head, got > 0 ? static_cast<size_t>(got) : 0}, path);
  return header_;
}

void ObjectReader::read(const std::function<void(const uint8_t*, size_t)>& consume) {
  const std::string& path = path_;
  const int fd = in_.get();
  const uint64_t raw_size = header_.raw_size;
  uint64_t produced = 0;
  auto pass = [&](const uint8_t* data, size_t n) {
    if (produced + n > raw_size) throw ObjectError(path + ": corrupt object (decompresses to more than its size)");
    consume(data, n);
    produced += n;
  };
  uint64_t pos = kObjectHeader;
  const bool raw = header_.stored;
  if (raw) {  // stored bytes (zstd level 0): read straight into the window
    for (;;) {
      ssize_t n = pread_some(fd, b_->out.get(), kWindow, pos);
      if (n < 0) throw ObjectError(path + ": read failed: " + std::strerror(errno));
      if (n == 0) break;
      pos += static_cast<uint64_t>(n);
      pass(b_->out.get(), static_cast<size_t>(n));
    }
  }
  ZSTD_DCtx_reset(b_->dctx.get(), ZSTD_reset_session_only);  // keeps the parameters
  ZSTD_inBuffer ib{b_->in.get(), 0, 0};
  size_t ret = 1;
  bool full = false;  // the last call filled the window: the decoder may hold more output
  for (; !raw;) {
    if (ib.pos == ib.size && !full) {
      ssize_t n = pread_some(fd, b_->in.get(), kInBlock, pos);
      if (n < 0) throw ObjectError(path + ": read failed: " + std::strerror(errno));
      if (n == 0) break;
      pos += static_cast<uint64_t>(n);
      ib = {b_->in.get(), static_cast<size_t>(n), 0};
    }
    ZSTD_outBuffer ob{b_->out.get(), kWindow, 0};
    ret = ZSTD_decompressStream(b_->dctx.get(), &ob, &ib);
    if (ZSTD_isError(ret)) throw ObjectError(path + ": corrupt object (zstd: " + ZSTD_getErrorName(ret) + ")");
    pass(b_->out.get(), ob.pos);
    full = ob.pos == ob.size;
    if (ret == 0 && !full) break;  // frame complete and flushed
  }
  if (!raw && ret != 0) throw ObjectError(path + ": corrupt object (truncated zstd frame)");
  uint8_t extra;
  if (!raw && (ib.pos != ib.size || pread_some(fd, &extra, 1, pos) != 0))
    throw ObjectError(path + ": corrupt object (bytes after the zstd frame)");
  if (produced != raw_size)
    throw ObjectError(path + ": corrupt object (decompressed to " + std::to_string(produced) + " bytes)");
  in_.reset();
}

}  // namespace ucpkit::formats
