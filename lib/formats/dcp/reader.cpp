// DCP data files: items cut out of mapped `__{rank}_{k}.distcp` files, tensor items decoded as the
// torch.save zips they are, chunks copied into their box of the global tensor.
#include "formats/dcp/reader.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "core/confine.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "io/torch/verify.h"

namespace ucpkit::formats::dcp {

namespace {

std::string box_text(const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t d = 0; d < offsets.size(); ++d)
    s += (d ? ", " : "") + std::to_string(offsets[d]) + ":" + std::to_string(offsets[d] + sizes[d]);
  return s + "]";
}

bool overlap(const Chunk& a, const Chunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  return true;
}

// Elements of a box; fails (naming `file`) past 2^62, which no real tensor reaches.
uint64_t volume(const std::vector<int64_t>& sizes, const std::string& file, const std::string& fqn) {
  uint64_t n = 1;
  for (int64_t s : sizes) {
    if (s != 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(s)) fail(file, "DCP: '" + fqn + "' has an absurd size");
    n *= static_cast<uint64_t>(s);
  }
  return n;
}

// Copies a contiguous chunk into its box of the contiguous global tensor `out`, row by row.
void copy_box(const Tensor& chunk, const Chunk& box, Tensor& out) {
  const size_t es = dtype_size(out.dtype());
  const auto src = chunk.contiguous_bytes();
  uint8_t* dst = out.storage()->mutable_bytes().data();
  const size_t n = box.sizes.size();
  if (n == 0) {
    std::memcpy(dst, src.data(), es);
    return;
  }
  for (int64_t s : box.sizes)
    if (s == 0) return;
  const std::vector<int64_t> gstride = Tensor::contiguous_strides(out.shape());
  const size_t row = static_cast<size_t>(box.sizes[n - 1]) * es;
  std::vector<int64_t> idx(n - 1, 0);
  for (size_t from = 0; from < src.size(); from += row) {
    int64_t at = box.offsets[n - 1];
    for (size_t d = 0; d + 1 < n; ++d) at += (box.offsets[d] + idx[d]) * gstride[d];
    std::memcpy(dst + static_cast<size_t>(at) * es, src.data() + from, row);
    for (size_t d = n - 1; d-- > 0;) {  // next row: odometer over the leading dims
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

// Drops this process's pages of [offset, offset + length) of a mapped data file once the item is
// copied out: a conversion that touches every item keeps one item's pages, not the whole file's, in its
// resident set (the page cache keeps them).
void release_item_pages(const MappedFile& file, uint64_t offset, uint64_t length) {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(file.data());
  const uintptr_t lo = (base + offset + page - 1) & ~(page - 1);
  const uintptr_t hi = (base + offset + length) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

}  // namespace

void check_chunks_cover(const Entry& e, const std::string& file) {
  const std::string what = "DCP: chunks of '" + escaped_brief(e.fqn) + "' ";
  uint64_t total = 0;
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const Chunk& c = e.chunks[k];
    for (size_t d = 0; d < e.size.size(); ++d)
      if (c.sizes[d] > e.size[d] || c.offsets[d] > e.size[d] - c.sizes[d])
        fail(file, what + "do not fit its size: chunk " + box_text(c.offsets, c.sizes) + " outside " +
                       box_text(std::vector<int64_t>(e.size.size(), 0), e.size));
    const uint64_t v = volume(c.sizes, file, e.fqn);
    for (size_t j = 0; j < k && v > 0; ++j)
      if (volume(e.chunks[j].sizes, file, e.fqn) > 0 && overlap(c, e.chunks[j]))
        fail(file, what + "overlap: " + box_text(e.chunks[j].offsets, e.chunks[j].sizes) + " and " +
                       box_text(c.offsets, c.sizes));
    total += v;
  }
  const uint64_t want = volume(e.size, file, e.fqn);
  if (total != want)
    fail(file, what + "leave a gap: they hold " + std::to_string(total) + " of its " + std::to_string(want) +
                   " elements");
}

Reader::Reader(std::string dir, std::string metadata_file)
    : dir_(std::move(dir)),
      md_(read_metadata(metadata_file.empty() ? (std::filesystem::path(dir_) / ".metadata").string() : metadata_file)) {}

Reader::Reader(std::string dir, Metadata metadata) : dir_(std::move(dir)), md_(std::move(metadata)) {}

const Entry& Reader::entry(const std::string& fqn, bool bytes) const {
  const Entry* e = md_.find(fqn);
  if (!e) fail(md_.path, "DCP: no entry '" + escaped_brief(fqn) + "'");
  if (e->is_bytes != bytes)
    fail(md_.path, "DCP: '" + escaped_brief(fqn) + "' is a " + (e->is_bytes ? "bytes" : "tensor") + " entry");
  return *e;
}

std::span<const uint8_t> Reader::item_bytes(const Item& item, std::shared_ptr<const MappedFile>& keep,
                                            std::string& file) const {
  file = confined_path(dir_, item.storage.relative_path, md_.path, "DCP data file").string();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = files_[file];
    if (!slot) slot = MappedFile::open(file);
    keep = slot;
  }
  const StorageInfo& s = item.storage;
  if (s.offset > keep->size() || s.length > keep->size() - s.offset)
    fail(file, "DCP item '" + escaped_brief(item.fqn) + "' [" + std::to_string(s.offset) + ", +" +
                   std::to_string(s.length) + ") runs past the end of the file (" + std::to_string(keep->size()) +
                   " bytes)");
  if (s.transforms)
    fail(file, "DCP item '" + escaped_brief(item.fqn) + "' is stored through " + std::to_string(s.transforms) +
                   " transform(s) (torch >= 2.7 compression), which this reader does not decode yet");
  return keep->bytes().subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.length));
}

Tensor Reader::read_chunk(const std::string& fqn, size_t k) const {
  const Entry& e = entry(fqn, false);
  if (k >= e.chunks.size()) fail(md_.path, "DCP: '" + escaped_brief(fqn) + "' has no chunk " + std::to_string(k));
  const Chunk& c = e.chunks[k];
  const Item& item = md_.item_of(fqn, &c.offsets);
  std::shared_ptr<const MappedFile> keep;
  std::string file;
  const auto bytes = item_bytes(item, keep, file);
  // The item is copied out of the map (load_torch_bytes owns its bytes): one chunk in memory at a time.
  const std::string name = file + " (item '" + escaped_brief(fqn) + "' at byte " + std::to_string(item.storage.offset) + ")";
  TorchLoadOptions load;
  load.verify_crc = verify_files_crc();  // the tools' --verify: every record's CRC-32 
  TorchFile tf = load_torch_bytes(bytes, name, load);
  release_item_pages(*keep, item.storage.offset, item.storage.length);
  if (!tf.root || tf.root->kind != pickle::Kind::Tensor)
    fail(name, "DCP: a tensor item holds " + (tf.root ? tf.root->repr(1) : std::string("nothing")));
  Tensor t = tf.root->as_tensor();
  if (t.dtype() != e.dtype || t.shape() != c.sizes)
    fail(name, "DCP: the item is a " + std::string(dtype_name(t.dtype())) + " tensor of shape " +
                   box_text(std::vector<int64_t>(t.shape().size(), 0), t.shape()) + ", the metadata says " +
                   std::string(dtype_name(e.dtype)) + " chunk " + box_text(c.offsets, c.sizes));
  return t;
}

Tensor Reader::read_tensor(const std::string& fqn) const {
  const Entry& e = entry(fqn, false);
  check_chunks_cover(e, md_.path);
  Tensor out = Tensor::zeros(e.dtype, e.size);
  for (size_t k = 0; k < e.chunks.size(); ++k) copy_box(read_chunk(fqn, k).contiguous(), e.chunks[k], out);
  return out;
}

std::vector<uint8_t> Reader::read_bytes(const std::string& fqn) const {
  entry(fqn, true);
  const Item& item = md_.item_of(fqn, nullptr);
  std::shared_ptr<const MappedFile> keep;
  std::string file;
  const auto b = item_bytes(item, keep, file);
  return {b.begin(), b.end()};
}

pickle::ValuePtr Reader::read_object(const std::string& fqn) const {
  const std::vector<uint8_t> bytes = read_bytes(fqn);
  const Item& item = md_.item_of(fqn, nullptr);
  const std::string file = (std::filesystem::path(dir_) / item.storage.relative_path).string();
  TorchLoadOptions load;
  load.verify_crc = verify_files_crc();
  return load_torch_bytes(bytes, file + " (item '" + escaped_brief(fqn) + "' at byte " + std::to_string(item.storage.offset) + ")",
                          load)
      .root;
}

}  // namespace ucpkit::formats::dcp
