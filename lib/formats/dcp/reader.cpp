// DCP data files: items cut out of mapped `__{rank}_{k}.distcp` files, tensor items decoded in place
// as the torch.save zips they are, chunks copied as runs of bytes into the global tensor's windows.
#include "formats/dcp/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>

#include "core/file_io.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/crc32.h"
#include "core/mapped_file.h"
#include "core/staging.h"
#include "formats/dcp/safetensors_flavour.h"
#include "formats/dcp/transforms.h"
#include "io/torch/torch_file.h"
#include "io/torch/verify.h"
#include "io/zip/zip_reader.h"

namespace ucpkit::formats::dcp {

// How messages name an item: "<file> (item '<fqn>' at byte N)".
static std::string item_name(const std::string& file, const std::string& fqn, uint64_t at) {
  return file + " (item '" + escaped_brief(fqn) + "' at byte " + std::to_string(at) + ")";
}

// A tensor item decoded where it lies (formats/dcp/reader.h, stored_chunk): the chunk's elements,
// row-major, inside the mapped data file (or, for a big-endian or oddly strided item, in a copy).
struct Stored {
  Tensor tensor;                    // keeps the map (or the copy) alive
  std::span<const uint8_t> bytes;   // the chunk's elements
  bool mapped = false;              // `bytes` lie in the data file's map (their pages may be dropped)
  std::span<const uint8_t> item;    // the whole item (zip) in the map
  std::shared_ptr<const MappedFile> map;  // the data file's map (its pages dropped through it)
  std::optional<uint32_t> crc;      // the data record's CRC-32, to check over `bytes` as they are copied
  std::string record;               // that record's name
  const std::string* file = nullptr;  // the data file's path (the Reader's)
  const std::string* fqn = nullptr;   // the item's (the metadata's)
  uint64_t at = 0;                    // the item's first byte in the file
  // "<file> (item '<fqn>' at byte N)", made when a message needs it (for every item, a tenth of the reading thread)
  std::string name() const { return item_name(*file, *fqn, at); }
};

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

// Drops this process's pages of the bytes [lo, hi) of a mapped data file once they are copied out: a
// conversion that touches every item keeps the pages of the window being copied, not the whole
// file's, in its resident set (the page cache keeps them). Whole pages inside the range only.
void release_pages(const uint8_t* lo, const uint8_t* hi) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (reinterpret_cast<uintptr_t>(lo) + page - 1) & ~(page - 1);
  const uintptr_t b = reinterpret_cast<uintptr_t>(hi) & ~(page - 1);
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

}  // namespace

std::string crc_mismatch(const std::string& record) { return "zip: CRC-32 mismatch in record '" + record + "'"; }

void check_chunks_cover(const Entry& e, const std::string& file) {
  auto what = [&e] { return "DCP: chunks of '" + escaped_brief(e.fqn) + "' "; };  // made for an error only
  uint64_t total = 0;
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const Chunk& c = e.chunks[k];
    for (size_t d = 0; d < e.size.size(); ++d)
      if (c.sizes[d] > e.size[d] || c.offsets[d] > e.size[d] - c.sizes[d])
        fail(file, what() + "do not fit its size: chunk " + box_text(c.offsets, c.sizes) + " outside " +
                       box_text(std::vector<int64_t>(e.size.size(), 0), e.size));
    const uint64_t v = volume(c.sizes, file, e.fqn);
    for (size_t j = 0; j < k && v > 0; ++j)
      if (volume(e.chunks[j].sizes, file, e.fqn) > 0 && overlap(c, e.chunks[j]))
        fail(file, what() + "overlap: " + box_text(e.chunks[j].offsets, e.chunks[j].sizes) + " and " +
                       box_text(c.offsets, c.sizes));
    total += v;
  }
  const uint64_t want = volume(e.size, file, e.fqn);
  if (total != want)
    fail(file,
         what() + "leave a gap: they hold " + std::to_string(total) + " of its " + std::to_string(want) + " elements");
}

std::optional<Entry> leading_sub_entry(const Entry& e, const std::vector<int64_t>& index, std::vector<size_t>& which) {
  const size_t lead = index.size();
  Entry sub{e.fqn, false, e.dtype, std::vector<int64_t>(e.size.begin() + static_cast<std::ptrdiff_t>(lead), e.size.end()), {}};
  which.clear();
  for (size_t k = 0; k < e.chunks.size(); ++k) {
    const auto& c = e.chunks[k];
    bool inside = true, single = true;
    for (size_t d = 0; d < lead; ++d) {
      inside = inside && c.offsets[d] <= index[d] && index[d] < c.offsets[d] + c.sizes[d];
      single = single && c.sizes[d] == 1;
    }
    if (!inside) continue;
    if (!single) return std::nullopt;
    which.push_back(k);
    sub.chunks.push_back({std::vector<int64_t>(c.offsets.begin() + static_cast<std::ptrdiff_t>(lead), c.offsets.end()),
                          std::vector<int64_t>(c.sizes.begin() + static_cast<std::ptrdiff_t>(lead), c.sizes.end())});
  }
  return sub;
}

Reader::Reader(std::string dir, std::string metadata_file)
    : dir_(std::move(dir)),
      md_(read_metadata(metadata_file.empty() ? (std::filesystem::path(dir_) / ".metadata").string() : metadata_file)) {}

Reader::Reader(std::string dir, Metadata metadata) : dir_(std::move(dir)), md_(std::move(metadata)) {}

Reader::~Reader() {
  for (const auto& [file, fd] : descriptors_) ::close(fd);
}

int Reader::descriptor(const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = descriptors_.find(file);
  if (it != descriptors_.end()) return it->second;
  const int fd = open_input(file, "DCP data file").release();  // a FIFO is refused, not waited on
  descriptors_.emplace(file, fd);
  return fd;
}

const Entry& Reader::entry(const std::string& fqn, bool bytes) const {
  const Entry* e = md_.find(fqn);
  if (!e) fail(md_.path, "DCP: no entry '" + escaped_brief(fqn) + "'");
  if (e->is_bytes != bytes)
    fail(md_.path, "DCP: '" + escaped_brief(fqn) + "' is a " + (e->is_bytes ? "bytes" : "tensor") + " entry");
  return *e;
}

std::shared_ptr<const MappedFile> Reader::mapped(const std::string& file) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = files_[file];
  if (!slot) slot = MappedFile::open(file);
  return slot;
}

std::span<const uint8_t> Reader::item_bytes(const Item& item, std::shared_ptr<const MappedFile>& keep,
                                            const std::string*& file) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto it = data_files_.find(item.storage.relative_path); it != data_files_.end()) {
      file = &it->second.path;
      keep = it->second.map;
    }
  }
  if (!keep) {
    std::string path =
        confined_path(dir_, item.storage.relative_path, md_.path, "DCP data file").string();  // refused: not kept
    keep = mapped(path);
    std::lock_guard<std::mutex> lock(mu_);
    file = &data_files_.try_emplace(item.storage.relative_path, DataFile{std::move(path), keep}).first->second.path;
  }
  const StorageInfo& s = item.storage;
  if (s.offset > keep->size() || s.length > keep->size() - s.offset)
    fail(*file, "DCP item '" + escaped_brief(item.fqn) + "' [" + std::to_string(s.offset) + ", +" +
                    std::to_string(s.length) + ") runs past the end of the file (" + std::to_string(keep->size()) +
                    " bytes)");
  return keep->bytes().subspan(static_cast<size_t>(s.offset), static_cast<size_t>(s.length));
}

Stored Reader::stored_chunk(const Entry& e, size_t k, bool view) const {
  const std::string& fqn = e.fqn;
  if (k >= e.chunks.size()) fail(md_.path, "DCP: '" + escaped_brief(fqn) + "' has no chunk " + std::to_string(k));
  const Chunk& c = e.chunks[k];
  const Item& item = md_.item_of(fqn, &c.offsets);
  std::shared_ptr<const MappedFile> keep;
  Stored s;
  s.item = item_bytes(item, keep, s.file);
  s.map = keep;
  s.fqn = &fqn;
  s.at = item.storage.offset;
  std::shared_ptr<const MappedFile> zip_file;  // the item's zip, when it was parsed
  bool in_place = false;                       // s.tensor is a view of the data file's map
  if (item.storage.raw) {  // the safetensors flavour: the chunk's bytes as they are, copied
    s.tensor = raw_chunk(s.item, e.dtype, c.sizes, s.name());
  } else if (item.storage.transforms) {  // zstd: the zip decoded into memory (formats/dcp/transforms.h)
    TorchLoadOptions load;
    load.verify_crc = verify_files_crc();  // every record's CRC-32 of the decoded zip
    const uint64_t most = volume(c.sizes, md_.path, fqn) * dtype_size(e.dtype) + (1u << 20);  // the zip's data + records
    TorchFile tf = load_torch_bytes(undo_transforms(s.item, item.storage.transform_descriptors, s.name(), most),
                                    s.name(), load);
    if (!tf.root || tf.root->kind != pickle::Kind::Tensor)
      fail(s.name(), "DCP: a tensor item holds " + (tf.root ? tf.root->repr(1) : std::string("nothing")));
    s.tensor = tf.root->as_tensor();
  } else {
    if (view) {  // the caller makes its own storage over the record: only where it is, when it is the chunk's tensor
      std::optional<TensorZipReader::Placed> placed;
      {
        std::lock_guard<std::mutex> lock(zips_mu_);
        placed = zips_.match_place(keep, item.storage.offset, item.storage.length, verify_files_crc(), e.dtype,
                                   c.sizes);
      }
      if (placed) {
        s.bytes = keep->bytes().subspan(static_cast<size_t>(placed->data), static_cast<size_t>(placed->size));
        s.mapped = true;
        if (verify_files_crc()) s.crc = placed->crc, s.record = std::move(placed->record);
        return s;
      }
    }
    std::optional<TensorZipReader::Found> known;
    {
      std::lock_guard<std::mutex> lock(zips_mu_);
      known = zips_.match(keep, item.storage.offset, item.storage.length, verify_files_crc());
    }
    if (known) {
      // The same zip as an earlier item's but for its data: the same tensor over this item's record.
      s.tensor = std::move(known->tensor);
      in_place = true;
      if (verify_files_crc()) s.crc = known->crc, s.record = std::move(known->record);
    } else {
      // The item's zip read in place: its directory and pickle are parsed, its storage is a view of the map.
      zip_file = MappedFile::slice(keep, static_cast<size_t>(item.storage.offset),
                                   static_cast<size_t>(item.storage.length), s.name());
      TorchFile tf = load_torch_mapped(zip_file);
      if (!tf.root || tf.root->kind != pickle::Kind::Tensor)
        fail(s.name(), "DCP: a tensor item holds " + (tf.root ? tf.root->repr(1) : std::string("nothing")));
      s.tensor = tf.root->as_tensor();
      in_place = true;
    }
  }
  const Tensor& t = s.tensor;
  if (t.dtype() != e.dtype || t.shape() != c.sizes)
    fail(s.name(), "DCP: the item is a " + std::string(dtype_name(t.dtype())) + " tensor of shape " +
                       box_text(std::vector<int64_t>(t.shape().size(), 0), t.shape()) + ", the metadata says " +
                       std::string(dtype_name(e.dtype)) + " chunk " + box_text(c.offsets, c.sizes));
  if (t.numel() > 0) {
    if (!t.is_contiguous()) s.tensor = t.contiguous(true);
    const size_t es = dtype_size(t.dtype());
    s.bytes = s.tensor.storage()->bytes().subspan(static_cast<size_t>(s.tensor.storage_offset()) * es,
                                                  static_cast<size_t>(t.numel()) * es);
    s.mapped = in_place && s.tensor.storage()->is_mapped();  // a view of the data file's map (not a decoded copy)
  }
  if (zip_file) {
    // The tools' --verify: every record's CRC-32, the data record's while it is copied. A small zip is remembered
    // for the items after it: those whose other records are these bytes (so these CRC-32s are theirs).
    const bool verify = verify_files_crc(), keep_it = item.storage.length <= TensorZipReader::kMaxBytes;
    if (verify || keep_it) {
      const ZipReader zip(zip_file);
      std::optional<std::string> data;  // the record s.bytes are (none when they were copied)
      for (const auto& [rname, rec] : zip.records()) {
        const auto b = zip.bytes(rec);
        if (s.mapped && !data && b.data() == s.bytes.data() && b.size() == s.bytes.size()) {
          data = rname;
          if (verify) s.crc = rec.crc32, s.record = rname;
        } else if (verify && crc32_parallel(b) != rec.crc32) {
          fail(s.name(), crc_mismatch(rname));
        }
      }
      if (data && keep_it) {
        std::lock_guard<std::mutex> lock(zips_mu_);
        zips_.remember(s.item, s.tensor, zip.records(), *data, verify);
      }
    }
  }
  return s;
}

namespace {

// The bytes of one chunk laid into the global tensor: `runs` runs of `run` bytes each (the chunk's
// extent along dims [split, n) is contiguous in the global tensor, as every dim after `split` is
// whole), the r-th starting at start(r).
struct Piece {
  Stored s;
  std::vector<int64_t> offsets, sizes, gstride;
  size_t split = 0;
  uint64_t es = 0, run = 0, runs = 0;
  // progress
  uint64_t next_run = 0, done = 0, released = 0;
  uint32_t crc = 0;
  bool finished = false;

  uint64_t start(uint64_t r) const {  // byte offset of run r in the global tensor
    int64_t at = split < offsets.size() ? offsets[split] * gstride[split] : 0;
    for (size_t d = split; d-- > 0;) {
      const auto i = static_cast<int64_t>(r % static_cast<uint64_t>(sizes[d]));
      r /= static_cast<uint64_t>(sizes[d]);
      at += (offsets[d] + i) * gstride[d];
    }
    return static_cast<uint64_t>(at) * es;
  }
};

Piece piece_of(Stored s, const Chunk& c, const std::vector<int64_t>& size) {
  Piece p;
  p.s = std::move(s);
  p.offsets = c.offsets;
  p.sizes = c.sizes;
  p.gstride = Tensor::contiguous_strides(size);
  p.es = dtype_size(p.s.tensor.dtype());
  const size_t n = size.size();
  if (p.s.bytes.empty()) return p;  // no elements: no runs
  if (n == 0) {
    p.run = p.es, p.runs = 1;
    return p;
  }
  size_t split = n - 1;
  while (split > 0 && c.sizes[split] == size[split]) --split;
  p.split = split;
  uint64_t run = static_cast<uint64_t>(c.sizes[split]), runs = 1;
  for (size_t d = split + 1; d < n; ++d) run *= static_cast<uint64_t>(size[d]);
  for (size_t d = 0; d < split; ++d) runs *= static_cast<uint64_t>(c.sizes[d]);
  p.run = run * p.es, p.runs = runs;
  return p;
}

// Streams the chunks into the global tensor's bytes, window after window.
struct Stream {
  std::vector<Piece> pieces;
  uint64_t next = 0, total = 0;
  std::string fqn, metadata;

  void fill(uint64_t lo, std::span<uint8_t> out) {
    if (lo != next)
      fail(metadata, "DCP: '" + escaped_brief(fqn) + "' streamed out of order (bytes at " + std::to_string(lo) +
                         ", expected " + std::to_string(next) + "): internal error");
    const uint64_t hi = lo + out.size();
    for (Piece& p : pieces) {
      while (p.next_run < p.runs) {
        const uint64_t g = p.start(p.next_run), end = g + p.run;
        if (g >= hi) break;
        const uint64_t a = std::max(g, lo), b = std::min(end, hi);
        if (a < b) {
          const uint64_t from = p.next_run * p.run + (a - g);
          if (from != p.done) fail(metadata, "DCP: '" + escaped_brief(fqn) + "' chunks out of order: internal error");
          uint8_t* to = out.data() + (a - lo);
          std::memcpy(to, p.s.bytes.data() + from, b - a);
          if (p.s.crc) p.crc = crc32_update(p.crc, {to, b - a});
          p.done += b - a;
        }
        if (end > hi) break;
        ++p.next_run;
      }
      // A large chunk's pages go as it is copied; a small one's all at once when it is done (drop_pages gathers
      // them): a madvise per chunk of a 100,000-tensor reshard was 75,000 calls, 0.4 s of system time.
      if (p.s.mapped && p.done - p.released >= MappedFile::kDropBatch) {
        release_pages(p.s.bytes.data() + p.released, p.s.bytes.data() + p.done);
        p.released = p.done;
      }
      if (p.next_run == p.runs && !p.finished) {
        p.finished = true;
        if (p.s.crc && p.crc != *p.s.crc) fail(p.s.name(), crc_mismatch(p.s.record));
        p.s.map->drop_pages(p.s.item);
      }
    }
    next = hi;
    if (next == total)
      for (const Piece& p : pieces)
        if (p.done != p.s.bytes.size())
          fail(metadata, "DCP: '" + escaped_brief(fqn) + "': a chunk was not copied whole: internal error");
  }
};

}  // namespace

Tensor Reader::stream_tensor(const std::string& fqn) const {
  const Entry& e = entry(fqn, false);
  check_chunks_cover(e, md_.path);
  auto st = std::make_shared<Stream>();
  st->fqn = fqn;
  st->metadata = md_.path;
  for (size_t k = 0; k < e.chunks.size(); ++k) st->pieces.push_back(piece_of(stored_chunk(e, k), e.chunks[k], e.size));
  const int64_t numel = static_cast<int64_t>(volume(e.size, md_.path, fqn));
  st->total = static_cast<uint64_t>(numel) * dtype_size(e.dtype);
  auto storage = Storage::generated(e.dtype, numel, [st](uint64_t off, std::span<uint8_t> out) { st->fill(off, out); });
  return Tensor(std::move(storage), 0, e.size, Tensor::contiguous_strides(e.size));
}

Tensor Reader::read_chunk(const std::string& fqn, size_t k) const {
  const Entry& e = entry(fqn, false);
  Stored s = stored_chunk(e, k);
  // One chunk in memory at a time: copied out of the map (its CRC-32 computed on the copy), the
  // item's pages dropped.
  std::vector<uint8_t> bytes(s.bytes.begin(), s.bytes.end());
  if (s.crc && crc32_parallel(bytes) != *s.crc) fail(s.name(), crc_mismatch(s.record));
  s.map->drop_pages(s.item);
  return Tensor::from_bytes(e.dtype, e.chunks[k].sizes, std::move(bytes));
}

ChunkBytes Reader::locate_chunk(const std::string& fqn, size_t k) const {
  const Entry& e = entry(fqn, false);
  Stored s = stored_chunk(e, k);
  ChunkBytes c;
  c.box = e.chunks[k];
  c.nbytes = s.bytes.size();
  c.crc = s.crc;
  c.record = s.record;
  c.name = s.name();
  if (s.mapped) {  // the record in the data file: its place, the pages the decoding touched dropped
    const Item& item = md_.item_of(fqn, &c.box.offsets);
    c.file = confined_path(dir_, item.storage.relative_path, md_.path, "DCP data file").string();
    c.file_offset = item.storage.offset + static_cast<uint64_t>(s.bytes.data() - s.item.data());
    s.map->drop_pages(s.item);
  } else if (c.nbytes > 0) {
    c.memory = s.tensor;
  }
  return c;
}

Tensor Reader::read_tensor(const std::string& fqn) const {
  const Tensor t = stream_tensor(fqn);
  // Every byte is generated: not zeroed first (a pass over each tensor of a reshard).
  auto st = Storage::uninitialized(t.dtype(), t.numel());
  if (t.numel() > 0) t.storage()->generate(0, st->mutable_bytes());
  return Tensor(std::move(st), 0, t.shape(), Tensor::contiguous_strides(t.shape()));
}

std::optional<Tensor> Reader::view_tensor(const std::string& fqn) const {
  const Entry& e = entry(fqn, false);
  if (e.chunks.size() != 1) return std::nullopt;
  check_chunks_cover(e, md_.path);
  Stored s = stored_chunk(e, 0, true);
  if (!s.mapped) return s.tensor;  // decoded (or empty): contiguous, of the chunk's shape, which is the tensor's
  // The record's pages come in here, on the caller's thread (read_ahead's): by the CRC-32 pass, or all at once. A
  // record larger than one drop batch gives its pages back as the pass goes (the writer faults them in again from the
  // page cache as it copies; they go when the tensor does, as read_tensor's copy of it would).
  const size_t n = s.bytes.size();
  if (s.crc) {
    uint32_t crc = 0;
    for (size_t done = 0; done < n;) {
      check_interrupted();  // SIGINT/SIGTERM between windows of a large record
      const auto window = s.bytes.subspan(done, std::min(MappedFile::kDropBatch, n - done));
      crc = crc32_parallel(window, crc);
      done += window.size();
      if (n > MappedFile::kDropBatch) s.map->drop_pages(window);
    }
    if (crc != *s.crc) fail(s.name(), crc_mismatch(s.record));
  } else if (n <= MappedFile::kDropBatch) {
    s.map->prefault(static_cast<size_t>(s.bytes.data() - s.map->data()), n);
  }
  // A storage over the item's own slice of the map, which drops the item's pages when its last storage goes.
  // Named by its map (the data file's path; a copy of it per item was a malloc per tensor).
  auto item = MappedFile::slice(s.map, static_cast<size_t>(s.item.data() - s.map->data()), s.item.size(),
                                *s.file == s.map->path() ? std::string() : *s.file, true);
  const auto numel = static_cast<int64_t>(volume(e.size, md_.path, fqn));
  auto storage = Storage::mapped(e.dtype, numel, std::move(item), static_cast<uint64_t>(s.bytes.data() - s.item.data()));
  storage->crc32 = s.crc;  // checked above: the DCP writer's zip of these bytes takes it
  return Tensor(std::move(storage), 0, e.size, Tensor::contiguous_strides(e.size));
}

std::vector<uint8_t> Reader::read_bytes(const std::string& fqn) const {
  entry(fqn, true);
  const Item& item = md_.item_of(fqn, nullptr);
  std::shared_ptr<const MappedFile> keep;
  const std::string* file = nullptr;
  const auto b = item_bytes(item, keep, file);
  if (item.storage.transforms)
    return undo_transforms(b, item.storage.transform_descriptors, item_name(*file, fqn, item.storage.offset));
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
