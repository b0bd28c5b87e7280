// DCP stream transforms undone: zstd frames decoded with libzstd's streaming API (ZstdCompressor's
// stream_writer writes frames without a content size, _extension.py:121-124).
#include "formats/dcp/transforms.h"

#include <zstd.h>

#include <memory>

#include "core/error.h"

namespace ucpkit::formats::dcp {

namespace {

constexpr std::string_view kZstd = "stream.zstd";

// "name[@domain]/version" -> is it stream.zstd of major version 1?
bool is_zstd_v1(const std::string& d) {
  const size_t slash = d.find('/');
  if (slash == std::string::npos || std::string_view(d).substr(0, slash) != kZstd) return false;
  const std::string version = d.substr(slash + 1);
  return version.substr(0, version.find('.')) == "1";
}

std::vector<uint8_t> unzstd(std::span<const uint8_t> in, const std::string& name, uint64_t max_bytes) {
  std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> dctx{ZSTD_createDCtx(), ZSTD_freeDCtx};
  if (!dctx) fail(name, "DCP: zstd: out of memory");
  std::vector<uint8_t> out;
  size_t used = 0, ret = 0;
  const unsigned long long known = ZSTD_getFrameContentSize(in.data(), in.size());
  out.resize(known != ZSTD_CONTENTSIZE_UNKNOWN && known != ZSTD_CONTENTSIZE_ERROR && known <= max_bytes
                 ? static_cast<size_t>(known) + 1
                 : std::max<size_t>(ZSTD_DStreamOutSize(), std::min<uint64_t>(in.size() * 4, max_bytes)));
  auto grow = [&] {
    if (out.size() - used >= ZSTD_DStreamOutSize() / 2) return;
    if (used > max_bytes)
      fail(name, "DCP: zstd item decodes to more than " + std::to_string(max_bytes) + " bytes, more than its chunk can take");
    out.resize(out.size() * 2);
  };
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  if (in.empty()) fail(name, "DCP: zstd item is empty (no frame)");
  while (ib.pos < ib.size) {
    grow();
    ZSTD_outBuffer ob{out.data() + used, out.size() - used, 0};
    ret = ZSTD_decompressStream(dctx.get(), &ob, &ib);
    if (ZSTD_isError(ret)) fail(name, std::string("DCP: corrupt zstd item (") + ZSTD_getErrorName(ret) + ")");
    used += ob.pos;
    if (ob.pos == 0 && ib.pos == ib.size) break;
  }
  // Input consumed: ret == 0 means the last frame ended exactly at the item's end. Otherwise the
  // decoder still wants input (a frame cut short) or holds output it could not flush yet.
  while (ret != 0) {
    grow();
    ZSTD_outBuffer ob{out.data() + used, out.size() - used, 0};
    ret = ZSTD_decompressStream(dctx.get(), &ob, &ib);
    if (ZSTD_isError(ret)) fail(name, std::string("DCP: corrupt zstd item (") + ZSTD_getErrorName(ret) + ")");
    used += ob.pos;
    if (ob.pos == 0 && ret != 0)
      fail(name, "DCP: zstd frame cut short: the item's " + std::to_string(in.size()) +
                     " bytes end inside a frame");
  }
  if (used > max_bytes)
    fail(name, "DCP: zstd item decodes to more than " + std::to_string(max_bytes) + " bytes, more than its chunk can take");
  out.resize(used);
  return out;
}

}  // namespace

void check_transforms(const std::vector<std::string>& descriptors, const std::string& name) {
  for (const std::string& d : descriptors)
    if (!is_zstd_v1(d))
      fail(name, "DCP: unknown transform '" + escaped_brief(d) + "' (this reader decodes stream.zstd/1 only)");
}

std::vector<uint8_t> undo_transforms(std::span<const uint8_t> stored, const std::vector<std::string>& descriptors,
                                     const std::string& name, uint64_t max_bytes) {
  check_transforms(descriptors, name);
  std::vector<uint8_t> bytes(stored.begin(), stored.end());
  for (size_t k = 0; k < descriptors.size(); ++k) bytes = unzstd(bytes, name, max_bytes);
  return bytes;
}

}  // namespace ucpkit::formats::dcp
