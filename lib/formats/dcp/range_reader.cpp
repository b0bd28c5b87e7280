// Element ranges of a DCP tensor read with pread from the runs its chunks lay into it (range_reader.h).
#include "formats/dcp/range_reader.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/crc32.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/dtype.h"

namespace ucpkit::formats::dcp {

namespace {

// The runs of bytes chunk `box` lays into the row-major tensor of `size`: as many runs as the chunk has
// rows along the dims before the last one it cuts, each contiguous in both.
template <typename Add>
void chunk_runs(const Chunk& box, const std::vector<int64_t>& size, uint64_t es, Add add) {
  const size_t n = size.size();
  if (n == 0) return add(uint64_t{0}, es, uint64_t{0});
  size_t split = n - 1;
  while (split > 0 && box.sizes[split] == size[split]) --split;
  const auto gstride = Tensor::contiguous_strides(size);
  uint64_t run = static_cast<uint64_t>(box.sizes[split]) * es;
  for (size_t d = split + 1; d < n; ++d) run *= static_cast<uint64_t>(size[d]);
  std::vector<int64_t> at(split, 0);  // index inside the box along dims [0, split), last fastest
  uint64_t runs = 1;
  for (size_t d = 0; d < split; ++d) runs *= static_cast<uint64_t>(box.sizes[d]);
  for (uint64_t r = 0; r < runs; ++r) {
    int64_t g = box.offsets[split] * gstride[split];
    for (size_t d = 0; d < split; ++d) g += (box.offsets[d] + at[d]) * gstride[d];
    add(static_cast<uint64_t>(g) * es, run, r * run);
    for (size_t d = split; d-- > 0;) {
      if (++at[d] < box.sizes[d]) break;
      at[d] = 0;
    }
  }
}

}  // namespace

std::unique_ptr<RangeReader> RangeReader::open(const Reader& reader, const std::string& fqn,
                                               const std::vector<int64_t>& index) {
  const auto& md = reader.metadata();
  const Entry* e = md.find(fqn);
  if (!e || e->is_bytes || e->size.size() < index.size())
    fail(md.path, "DCP: no tensor '" + escaped_brief(fqn) + "' with " + std::to_string(index.size()) + " leading axes");
  std::vector<size_t> which;
  const auto found = leading_sub_entry(*e, index, which);
  if (!found) return nullptr;  // a chunk spans several layers: not a sub-tensor of whole chunks
  const Entry& sub = *found;
  check_chunks_cover(sub, md.path);
  std::unique_ptr<RangeReader> r(new RangeReader);
  r->dtype_ = e->dtype;
  r->shape_ = sub.size;
  r->numel_ = 1;
  for (int64_t s : sub.size) r->numel_ *= s;
  r->metadata_ = md.path;
  r->reader_ = &reader;
  const uint64_t es = dtype_size(e->dtype);
  for (size_t i = 0; i < which.size(); ++i) {
    ChunkBytes c = reader.locate_chunk(fqn, which[i]);
    c.box = sub.chunks[i];
    int fd = -1;
    if (!c.file.empty()) fd = reader.descriptor(c.file);
    const auto k = static_cast<uint32_t>(r->chunks_.size());
    if (c.nbytes > 0)
      chunk_runs(c.box, sub.size, es, [&](uint64_t at, uint64_t len, uint64_t from) { r->runs_.push_back({at, len, k, from}); });
    r->fds_.push_back(fd);
    r->chunks_.push_back(std::move(c));
  }
  std::sort(r->runs_.begin(), r->runs_.end(), [](const Run& a, const Run& b) { return a.at < b.at; });
  std::vector<Run> merged;  // runs of one chunk that follow each other in both: one read
  for (const Run& x : r->runs_) {
    if (!merged.empty() && merged.back().chunk == x.chunk && merged.back().at + merged.back().len == x.at &&
        merged.back().from + merged.back().len == x.from)
      merged.back().len += x.len;
    else
      merged.push_back(x);
  }
  r->runs_ = std::move(merged);
  uint64_t at = 0;
  for (const Run& x : r->runs_) {
    if (x.at != at) fail(md.path, "DCP: '" + escaped_brief(fqn) + "': chunk runs do not tile the tensor: internal error");
    at += x.len;
  }
  if (at != static_cast<uint64_t>(r->numel_) * es)
    fail(md.path, "DCP: '" + escaped_brief(fqn) + "': chunk runs do not tile the tensor: internal error");
  r->copied_.resize(r->chunks_.size());
  return r;
}

RangeReader::~RangeReader() = default;

void RangeReader::read_chunk_bytes(uint32_t chunk, uint64_t from, uint64_t len, uint8_t* dst) const {
  const ChunkBytes& c = chunks_[chunk];
  if (fds_[chunk] < 0) {
    std::memcpy(dst, c.memory.contiguous_bytes().data() + from, len);
    return;
  }
  uint64_t done = 0;
  while (done < len) {
    const ssize_t got = ::pread(fds_[chunk], dst + done, static_cast<size_t>(len - done),
                                static_cast<off_t>(c.file_offset + from + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(c.file, std::string("read failed: ") + std::strerror(errno));
    if (got == 0)
      fail(c.file, "ends at byte " + std::to_string(c.file_offset + from + done) + ", inside " + c.name);
    done += static_cast<uint64_t>(got);
  }
}

void RangeReader::copy(int64_t begin, int64_t n, uint8_t* dst) {
  const uint64_t es = dtype_size(dtype_);
  if (begin < 0 || n < 0 || begin + n > numel_)
    fail(metadata_, "DCP: elements [" + std::to_string(begin) + ", " + std::to_string(begin + n) + ") asked of a tensor of " +
                        std::to_string(numel_) + ": internal error");
  const uint64_t lo = static_cast<uint64_t>(begin) * es, hi = lo + static_cast<uint64_t>(n) * es;
  auto it = std::upper_bound(runs_.begin(), runs_.end(), lo, [](uint64_t v, const Run& x) { return v < x.at; });
  if (it != runs_.begin()) --it;
  for (; it != runs_.end() && it->at < hi; ++it) {
    const uint64_t a = std::max(lo, it->at), b = std::min(hi, it->at + it->len);
    if (a >= b) continue;
    uint8_t* to = dst + (a - lo);
    const uint64_t from = it->from + (a - it->at);
    if (!chunks_[it->chunk].crc) {
      read_chunk_bytes(it->chunk, from, b - a, to);
      continue;
    }
    // Piece by piece, each checksummed while it is in the CPU cache.
    constexpr uint64_t kPiece = 1u << 20;
    uint32_t crc = 0;
    for (uint64_t at = 0; at < b - a; at += kPiece) {
      const uint64_t n = std::min(kPiece, b - a - at);
      read_chunk_bytes(it->chunk, from + at, n, to + at);
      crc = crc32_update(crc, {to + at, static_cast<size_t>(n)});
    }
    std::lock_guard<std::mutex> lock(mu_);
    copied_[it->chunk].push_back({from, b - a, crc});
  }
}

void RangeReader::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  std::vector<uint8_t> scratch;
  for (uint32_t k = 0; k < chunks_.size(); ++k) {
    const ChunkBytes& c = chunks_[k];
    if (!c.crc) continue;
    auto& segs = copied_[k];
    std::sort(segs.begin(), segs.end(), [](const Segment& a, const Segment& b) { return a.from < b.from; });
    uint32_t crc = 0;
    uint64_t pos = 0;
    auto gap = [&](uint64_t to) {  // bytes never asked for: read for the check only
      while (pos < to) {
        const uint64_t len = std::min<uint64_t>(to - pos, uint64_t{1} << 20);
        scratch.resize(static_cast<size_t>(len));
        read_chunk_bytes(k, pos, len, scratch.data());
        crc = crc32_update(crc, scratch);
        pos += len;
      }
    };
    for (const Segment& s : segs) {
      if (s.from < pos) fail(c.name, "bytes copied twice: internal error");
      gap(s.from);
      crc = crc32_combine(crc, s.crc, s.len);
      pos += s.len;
    }
    gap(c.nbytes);
    segs.clear();
    if (crc != *c.crc) fail(c.name, crc_mismatch(c.record));
  }
}

void RangeReader::check_now() {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t k = 0; k < chunks_.size(); ++k) {
    ChunkBytes& c = chunks_[k];
    if (!c.crc) continue;
    uint32_t crc = 0;
    if (fds_[k] < 0) {
      crc = crc32_update(0, c.memory.contiguous_bytes().first(static_cast<size_t>(c.nbytes)));
    } else {
      const std::shared_ptr<const MappedFile> map = reader_->mapped(c.file);
      if (c.file_offset > map->size() || c.nbytes > map->size() - c.file_offset)
        fail(c.file, "ends at byte " + std::to_string(map->size()) + ", inside " + c.name);
      constexpr uint64_t kPiece = uint64_t{8} << 20;
      for (uint64_t at = 0; at < c.nbytes; at += kPiece) {
        const std::span<const uint8_t> piece(map->data() + c.file_offset + at, static_cast<size_t>(std::min(kPiece, c.nbytes - at)));
        crc = crc32_update(crc, piece);
        map->drop_pages(piece);  // RSS stays a window (the pages stay in the page cache for the copies)
      }
    }
    if (crc != *c.crc) fail(c.name, crc_mismatch(c.record));
    c.crc.reset();
    copied_[k].clear();
  }
}

void RangeReader::trust() {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint32_t k = 0; k < chunks_.size(); ++k) {
    chunks_[k].crc.reset();
    copied_[k].clear();
  }
}

}  // namespace ucpkit::formats::dcp
