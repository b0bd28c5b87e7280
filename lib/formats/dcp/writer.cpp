// DCP folder writer: data files item by item (each chunk written as a torch.save zip by io/torch's
// writer straight into its rank's file), `.metadata` pickled from plain values with
// torch 2.6's class paths (torch/distributed/checkpoint/metadata.py, filesystem.py _StorageInfo;
// docs/formats-dcp.md "Writing").
#include "formats/dcp/writer.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <condition_variable>
#include <deque>
#include <exception>
#include <cstdint>
#include <optional>
#include <string_view>
#include <thread>
#include <tuple>

#include <tbb/parallel_for.h>

#include "core/atomic_file.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/exit_release.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "core/staging.h"
#include "formats/dcp/reader.h"
#include "io/generated_view.h"
#include "io/pickle/pickler.h"
#include "io/pickle/unpickler.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"

namespace ucpkit::formats::dcp {

using pickle::Value;
using pickle::ValuePtr;

// Named, not anonymous: MetadataPickle's state holds a Pool.
namespace metadata_writer {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

// The values of a `.metadata` written as Values, made once so that the pickler writes each once and refers to it
// after (as Python's pickler memoizes the same objects): the empty tuple every dataclass is made from and one
// TensorProperties per dtype. Everything else (the 10^5 entries and items, their field names, fqns and classes) is
// written piece by piece below, memoized the same way by text (PickleStream::str, global_value): a file of
// 100,000 tensors was 124 MB and took 2.9 GB to build without the memo, 24 MB as torch writes it; built as Values
// first, it was a second core's 0.9 s of a 1.9-s reshard.
class Pool {
 public:
  const ValuePtr& empty() const { return empty_; }
  // TensorProperties.__getstate__: (dtype, layout, requires_grad, _MEM_FORMAT_ENCODING, pin_memory); one object per
  // dtype, its class shared. A copy is returned: saved transient, an object held twice is memoized.
  ValuePtr properties(DType t) {
    ValuePtr& v = properties_[static_cast<int>(t)];
    if (!v) {
      v = Value::make_object(
          kMetadataModule, "TensorProperties", empty_,
          Value::tuple({Value::torch_dtype(t), layout_, Value::boolean(false), contiguous_, Value::boolean(false)}),
          pickle::Object::Build::NewObj);
      if (!properties_class_) properties_class_ = v->object->callable;
      v->object->callable = properties_class_;
    }
    return v;
  }

 private:
  ValuePtr empty_ = Value::tuple();
  // REDUCE(callable, args): torch.serialization._get_layout('torch.strided'), _MEM_FORMAT_ENCODING(0)
  ValuePtr layout_ = Value::make_object("torch.serialization", "_get_layout",
                                        Value::tuple({Value::str("torch.strided")}), nullptr);
  ValuePtr contiguous_ = Value::make_object(kMetadataModule, "_MEM_FORMAT_ENCODING", Value::tuple({Value::integer(0)}),
                                            nullptr);
  ValuePtr properties_class_;
  std::map<int, ValuePtr> properties_;
};

// Where each piece written for every entry or item was memoized, fetched by it after its first use without a lookup
// of its text (each is written 10^5 times).
struct Refs {
  using Ref = pickle::PickleStream::MemoRef;
  Ref empty;                                                                                     // the empty tuple
  Ref tensor_storage, bytes_storage, chunk_storage, metadata_index, storage_info, storage_meta;  // classes
  Ref properties, size, chunks, offsets, sizes, fqn, index, offset, relative_path, length;       // field names
  std::string path;  // the last item's relative_path (items come file by file), and where it was memoized
  Ref path_ref;
};

}  // namespace metadata_writer

namespace {

using metadata_writer::kFilesystemModule;
using metadata_writer::kMetadataModule;
using metadata_writer::Pool;
using metadata_writer::Refs;
using pickle::Op;
using pickle::PickleStream;

// A dataclass instance as pickle writes it: NEWOBJ(cls, ()), its class and the empty tuple shared.
void new_dataclass(PickleStream& out, const Pool& pool, Refs& r, const char* module, const char* name, Refs::Ref& cls) {
  out.global_value(module, name, cls);
  out.save_shared(pool.empty(), r.empty);  // held by every dataclass: memoized
  out.op(Op::NEWOBJ);
}

// BUILD of the instance on the stack with its field dict (not shared: not memoized), the n >= 1 pairs written by
// `pairs` (SETITEM for one, as the pickler writes a dict).
template <class F>
void build_fields(PickleStream& out, size_t n, F&& pairs) {
  out.op(Op::EMPTY_DICT);
  if (n > 1) out.op(Op::MARK);
  pairs();
  out.op(n > 1 ? Op::SETITEMS : Op::SETITEM);
  out.op(Op::BUILD);
}

// `n` items written by item(k) into the list or dict on the stack, in batches of 1,000 (a batch of one with
// `one`: APPEND / SETITEM), as the pickler fills a container.
template <class F>
void fill_batches(PickleStream& out, size_t n, Op one, Op many, F&& item) {
  for (size_t start = 0; start < n; start += 1000) {
    const size_t end = std::min(n, start + 1000);
    if (end - start > 1) out.op(Op::MARK);
    for (size_t k = start; k < end; ++k) item(k);
    out.op(end - start > 1 ? many : one);
  }
}

// TensorStorageMetadata(properties, size, chunks=[ChunkStorageMetadata(offsets, sizes), ...]) or
// BytesStorageMetadata, a field-less dataclass: pickle writes no state (its __dict__ is empty), so no BUILD.
void write_storage_entry(PickleStream& out, Pool& pool, Refs& r, const Entry& e) {
  if (e.is_bytes) return new_dataclass(out, pool, r, kMetadataModule, "BytesStorageMetadata", r.bytes_storage);
  new_dataclass(out, pool, r, kMetadataModule, "TensorStorageMetadata", r.tensor_storage);
  build_fields(out, 3, [&] {
    out.str("properties", r.properties);
    out.save(pool.properties(e.dtype), true);
    out.str("size", r.size);
    out.size(e.size);
    out.str("chunks", r.chunks);
    out.op(Op::EMPTY_LIST);
    fill_batches(out, e.chunks.size(), Op::APPEND, Op::APPENDS, [&](size_t k) {
      new_dataclass(out, pool, r, kMetadataModule, "ChunkStorageMetadata", r.chunk_storage);
      build_fields(out, 2, [&] {
        out.str("offsets", r.offsets);
        out.size(e.chunks[k].offsets);
        out.str("sizes", r.sizes);
        out.size(e.chunks[k].sizes);
      });
    });
  });
}

// MetadataIndex's __init__ sets fqn and index, and offset only when given (a bytes item has none).
// `index` is the chunk's position in its entry's list (the lookup hint), None for bytes items; `fqn_ref` where the fqn
// was memoized (its state_dict_metadata key).
void write_metadata_index(PickleStream& out, const Pool& pool, Refs& r, const std::string& fqn, Refs::Ref& fqn_ref,
                          const std::vector<int64_t>* offset, std::optional<size_t> index) {
  new_dataclass(out, pool, r, kMetadataModule, "MetadataIndex", r.metadata_index);
  build_fields(out, offset ? 3 : 2, [&] {
    out.str("fqn", r.fqn);
    out.str(fqn, fqn_ref);
    out.str("index", r.index);
    if (index) out.integer(static_cast<int64_t>(*index));
    else out.op(Op::NONE);
    if (offset) {
      out.str("offset", r.offset);
      out.size(*offset);
    }
  });
}

// _StorageInfo(relative_path, offset, length).
void write_storage_info(PickleStream& out, const Pool& pool, Refs& r, const StorageInfo& storage) {
  new_dataclass(out, pool, r, kFilesystemModule, "_StorageInfo", r.storage_info);
  build_fields(out, 3, [&] {
    out.str("relative_path", r.relative_path);
    if (storage.relative_path != r.path) {
      r.path = storage.relative_path;
      r.path_ref = {};
    }
    out.str(storage.relative_path, r.path_ref);
    out.str("offset", r.offset);
    out.integer(static_cast<int64_t>(storage.offset));
    out.str("length", r.length);
    out.integer(static_cast<int64_t>(storage.length));
  });
}

// DefaultSavePlanner's planner_data of a flat state dict: {fqn: (fqn,)}; `fqns` where each entry's fqn was memoized.
void write_flat_planner_data(PickleStream& out, const SavePlan& plan, std::vector<Refs::Ref>& fqns) {
  out.op(Op::EMPTY_DICT);
  fill_batches(out, plan.entries.size(), Op::SETITEM, Op::SETITEMS, [&](size_t k) {
    out.str(plan.entries[k].fqn, fqns[k]);
    out.str(plan.entries[k].fqn, fqns[k]);
    out.op(Op::TUPLE1);
  });
}

// DefaultSavePlanner's planner_data kept from a source (planner_paths.h): {flat fqn: tuple (or list) of its keys and
// indices}, each text memoized by content (a flat fqn is the state_dict_metadata key written before it: fetched by
// `fqns`, the plan's entry found after the last one found when the two list them in the same order).
void write_planner_paths(PickleStream& out, const PlannerPaths& paths, const SavePlan& plan,
                         std::vector<Refs::Ref>& fqns) {
  out.op(Op::EMPTY_DICT);
  size_t next = 0;  // the plan entry after the last flat fqn found in order
  // The keys met last, with where they were memoized: a path's keys mostly repeat those of the paths just before it
  // ("optim", "state", a parameter's name), found here by comparing a few short texts instead of hashing each one
  // (a tenth of the instructions of the plan's part of a 100,000-tensor `.metadata`).
  struct Recent {
    std::string_view key;
    Refs::Ref ref;
  };
  std::array<Recent, 8> recent{};
  size_t oldest = 0;
  auto key = [&](std::string_view text) {
    for (Recent& r : recent)
      if (r.key == text) return out.str(text, r.ref);
    Recent& r = recent[oldest++ % recent.size()];
    r = {text, {}};
    out.str(text, r.ref);
  };
  fill_batches(out, paths.size(), Op::SETITEM, Op::SETITEMS, [&](size_t k) {
    if (next < plan.entries.size() && plan.entries[next].fqn == paths.flat(k)) out.str(paths.flat(k), fqns[next++]);
    else out.str(paths.flat(k));
    auto part = [&](size_t j) {
      const PlannerPaths::Part p = paths.part(k, j);
      if (p.is_index) out.integer(p.index);
      else key(p.key);
    };
    const size_t n = paths.part_count(k);
    if (paths.is_list(k)) {
      out.op(Op::EMPTY_LIST);
      fill_batches(out, n, Op::APPEND, Op::APPENDS, part);
    } else {
      out.tuple_begin(n);
      for (size_t j = 0; j < n; ++j) part(j);
      out.tuple_end(n);
    }
  });
}

// Pairs in SETITEMS batches of 1,000 into the dict on top of the stack, as Python's pickler does.
template <class F>
void fill_dict(PickleStream& out, size_t n, F&& pair) {
  for (size_t start = 0; start < n; start += 1000) {
    out.op(Op::MARK);
    for (size_t k = start; k < std::min(n, start + 1000); ++k) pair(k);
    out.op(Op::SETITEMS);
  }
}

pickle::PickleOptions metadata_pickle_options() {
  pickle::PickleOptions po;
  po.storage_id = [](const std::shared_ptr<Storage>&) -> ValuePtr { throw Error("DCP metadata: a tensor inside"); };
  po.memoize_repeats = true;
  return po;
}

// A contiguous `shape` tensor of its own storage over `from`'s mapped bytes, from element `first` on.
Tensor mapped_part(const Storage& from, DType dtype, const std::vector<int64_t>& shape, int64_t first) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  auto part = Storage::mapped(dtype, numel, from.mapped_file(),
                              from.mapped_offset() + static_cast<uint64_t>(first) * dtype_size(dtype));
  return Tensor(std::move(part), 0, shape, Tensor::contiguous_strides(shape));
}

// The chunk as a tensor of its own storage (what DCP clones a view into before torch.save). A contiguous part
// of a larger storage becomes a storage of its own that copies from it as it is written (straight into the
// data file's block): a copy of the chunk in between was a third of a 2.6-GB reshard's copying.
Tensor own_storage(const Tensor& t) {
  if (t.is_contiguous() && t.storage_offset() == 0 && t.storage() && t.storage()->numel() == t.numel()) return t;
  if (!t.is_contiguous() || !t.storage() || t.storage()->is_generated() || t.numel() == 0) return t.contiguous(true);
  const std::shared_ptr<Storage> from = t.storage();
  // A part of a mapped file's storage: a storage of that part, its bytes at hand (CRC-32 first).
  if (from->is_mapped()) return mapped_part(*from, t.dtype(), t.shape(), t.storage_offset());
  const size_t at = static_cast<size_t>(t.storage_offset()) * dtype_size(t.dtype());
  auto view = Storage::generated(t.dtype(), t.numel(), [from, at](uint64_t off, std::span<uint8_t> out) {
    std::memcpy(out.data(), from->bytes().data() + at + off, out.size());
  });
  return Tensor(std::move(view), 0, t.shape(), Tensor::contiguous_strides(t.shape()));
}

// `part` (a storage of its own over elements [at, ...) of `whole`) with its CRC-32 known when `whole`'s is (its reader
// checked it) and the parts before it covered `whole` from its start: computed here, and the last part's found from
// the whole's and the others' (a second pass over those bytes saved: the writer's zip takes the CRC as it is).
// `covered` and `crc` go with the parts: the bytes covered so far and their CRC-32.
Tensor with_crc(Tensor part, const Storage& whole, int64_t at, uint64_t& covered, uint32_t& crc) {
  // Below this a part's own CRC-32 costs less than the two combines that would spare it.
  constexpr uint64_t kFrom = uint64_t{64} << 10;
  const std::shared_ptr<Storage>& st = part.storage();
  const uint64_t from = static_cast<uint64_t>(at) * dtype_size(part.dtype()), n = st ? st->nbytes() : 0;
  if (!whole.crc32 || !whole.is_mapped() || whole.nbytes() < kFrom || !st || !st->is_mapped() || from != covered)
    return part;
  if (from + n == whole.nbytes()) {
    st->crc32 = *whole.crc32 ^ crc32_combine(crc, 0, n);  // crc(A B) = crc(A) shifted by |B|, xor crc(B)
  } else {
    st->crc32 = crc32_parallel(st->bytes());
    crc = crc32_combine(crc, *st->crc32, n);
    covered += n;
  }
  return part;
}

// The box `c` of `whole` as a view (no copy).
Tensor box_view(const Tensor& whole, const Chunk& c) {
  Tensor t = whole;
  for (size_t d = 0; d < c.sizes.size(); ++d) t = t.narrow(static_cast<int64_t>(d), c.offsets[d], c.sizes[d]);
  return t;
}

// Rows [c.offsets[0], + c.sizes[0]) of a contiguous mapped `whole` (FSDP2's Shard(0) of a tensor read in place): a
// storage of those bytes of the whole's and the element it starts at, what own_storage(box_view(whole, c)) gives
// without the views in between (a tensor with its shape and strides for each dim narrowed, then one more: the chunk
// source's instructions 380 -> 271 million on 100,000 small tensors). Nullopt for any other box.
std::optional<std::pair<Tensor, int64_t>> rows_of_mapped(const Tensor& whole, const Chunk& c) {
  const std::shared_ptr<Storage>& st = whole.storage();
  const std::vector<int64_t>& shape = whole.shape();
  if (!st || !st->is_mapped() || c.sizes.empty() || c.sizes.size() != shape.size() || c.sizes == shape)
    return std::nullopt;
  int64_t row = 1;
  for (size_t d = 1; d < shape.size(); ++d) {
    if (c.offsets[d] != 0 || c.sizes[d] != shape[d]) return std::nullopt;
    row *= shape[d];
  }
  if (c.offsets[0] < 0 || c.sizes[0] <= 0 || c.offsets[0] + c.sizes[0] > shape[0] || !whole.is_contiguous())
    return std::nullopt;
  const int64_t first = whole.storage_offset() + c.offsets[0] * row;
  return std::pair{mapped_part(*st, whole.dtype(), c.sizes, first), first};
}

}  // namespace

Tensor cut_box(const Tensor& whole, const Chunk& c) {
  // A generated tensor's box stays generated (its bytes made as they are written; zeros stay a hole).
  if (whole.storage() && whole.storage()->is_generated()) return generated_box(whole, c.offsets, c.sizes);
  if (c.sizes == whole.shape()) return own_storage(whole);  // the whole tensor: no copy when it owns its storage
  return box_view(whole, c).contiguous(true);
}

ChunkSource chunks_of_whole(std::function<Tensor(const Entry&)> whole,
                            std::function<std::vector<uint8_t>(const Entry&)> bytes) {
  struct Cache {
    const Entry* entry = nullptr;  // the plan's entry read (a plan lists each fqn once)
    Tensor t;
    uint64_t covered = 0;  // bytes of t's storage from its start the parts so far cover, one after another
    uint32_t crc = 0;      // their CRC-32
  };
  auto cache = std::make_shared<Cache>();
  ChunkSource s;
  s.chunk = [whole = std::move(whole), cache](const Entry& e, size_t k) {
    if (cache->entry != &e || !cache->t.storage()) {
      cache->t = Tensor();  // the previous tensor goes before the next one is read
      cache->entry = nullptr;
      cache->t = whole(e);
      cache->entry = &e;
      cache->covered = 0;
      cache->crc = 0;
    }
    if (cache->t.shape() != e.size)
      throw Error("DCP writer: the source's '" + escaped_brief(e.fqn) + "' has shape " + shape_str(cache->t.shape()) +
                  ", the plan says " + shape_str(e.size));
    // Only the writer takes these chunks: a contiguous box (rows of a dim-0 shard) is a storage of that part of the
    // whole (own_storage), copied from it as it is written, not into a storage of its own first.
    const Chunk& c = e.chunks[k];
    if (auto rows = rows_of_mapped(cache->t, c))
      return with_crc(std::move(rows->first), *cache->t.storage(), rows->second, cache->covered, cache->crc);
    if (cache->t.storage() && !cache->t.storage()->is_generated() && c.sizes != cache->t.shape()) {
      const Tensor t = box_view(cache->t, c);
      if (t.is_contiguous())
        return with_crc(own_storage(t), *cache->t.storage(), t.storage_offset(), cache->covered, cache->crc);
    }
    return cut_box(cache->t, c);
  };
  s.bytes = std::move(bytes);
  return s;
}

// About the bytes of plan's `.metadata`, a little over (each fqn written at most twice, a chunk's dataclasses and
// torch.Size fetched from the memo: 100,000 tensors of 175,000 chunks were 30 MB).
size_t pickle_size_hint(const SavePlan& plan) {
  size_t bytes = 4096;
  for (const Entry& e : plan.entries) bytes += 2 * e.fqn.size() + 96 + e.chunks.size() * (96 + 16 * e.size.size());
  return bytes;
}

// Written as a stream: Metadata(), then BUILD of its fields, the two large dicts filled entry by entry, each
// entry's values built, saved and freed in turn (a tree of the whole was most of ucp-load's 1.6 GB on 100,000
// tensors).
struct MetadataPickle::State {
  metadata_writer::Pool pool;
  pickle::PickleOptions options = metadata_pickle_options();  // the stream keeps a reference
  pickle::PickleStream out{options};
  Refs refs;
  std::vector<Refs::Ref> fqns;  // where each plan entry's fqn was memoized
  const SavePlan* plan = nullptr;
  bool storage_data = false;  // its key and dict written (add())
  size_t added = 0;           // storage_data pairs so far
};

MetadataPickle::MetadataPickle(const SavePlan& plan, const WriteOptions& options)
    : options_(options), s_(std::make_unique<State>()) {
  Pool& pool = s_->pool;
  PickleStream& out = s_->out;
  Refs::Ref metadata_class;
  out.global_value(kMetadataModule, "Metadata", metadata_class);
  out.op(Op::EMPTY_TUPLE);  // NEWOBJ(Metadata, ())
  out.op(Op::NEWOBJ);
  out.op(Op::EMPTY_DICT);
  out.op(Op::MARK);
  // Texts: each entry's fqn, and planner_data's keys (most paths bring at most one new one).
  out.reserve(pickle_size_hint(plan), plan.entries.size() + (options.planner ? options.planner->size() : 0));
  out.str("state_dict_metadata");
  out.op(Op::EMPTY_DICT);
  s_->fqns.resize(plan.entries.size());
  fill_dict(out, plan.entries.size(), [&](size_t k) {
    out.str(plan.entries[k].fqn, s_->fqns[k]);
    write_storage_entry(out, pool, s_->refs, plan.entries[k]);
  });
  out.str("planner_data");
  if (options.other_planner_data) out.save(options.other_planner_data, true);
  else if (options.planner) write_planner_paths(out, *options.planner, plan, s_->fqns);
  else write_flat_planner_data(out, plan, s_->fqns);
  s_->plan = &plan;
}

MetadataPickle::~MetadataPickle() = default;

void MetadataPickle::add(const PlannedItem& at, const StorageInfo& storage) {
  const Entry& e = s_->plan->entries.at(at.entry);
  const bool bytes = at.chunk == PlannedItem::kBytes;
  PickleStream& out = s_->out;
  if (!s_->storage_data) {
    out.str("storage_data");
    out.op(Op::EMPTY_DICT);
    s_->storage_data = true;
  }
  if (s_->added % 1000 == 0) out.op(Op::MARK);  // SETITEMS batches of 1,000 pairs, as Python's pickler writes them
  write_metadata_index(out, s_->pool, s_->refs, e.fqn, s_->fqns[at.entry],
                       bytes ? nullptr : &e.chunks.at(at.chunk).offsets,
                       bytes ? std::nullopt : std::optional<size_t>(at.chunk));
  write_storage_info(out, s_->pool, s_->refs, storage);
  if (++s_->added % 1000 == 0) out.op(Op::SETITEMS);
}

std::string_view MetadataPickle::so_far() { return s_->out.so_far(); }

std::string MetadataPickle::finish(const std::string& checkpoint_id) {
  PickleStream& out = s_->out;
  if (!s_->storage_data) {
    out.str("storage_data");
    out.op(Op::EMPTY_DICT);
  } else if (s_->added % 1000 != 0) {
    out.op(Op::SETITEMS);
  }
  out.str("storage_meta");
  new_dataclass(out, s_->pool, s_->refs, kMetadataModule, "StorageMeta", s_->refs.storage_meta);
  auto text_or_none = [&](const std::string& text) {  // a Str of its own, memoized (as Python's pickler does)
    if (text.empty()) out.op(Op::NONE);
    else out.save(Value::str(text));
  };
  build_fields(out, 3, [&] {
    out.str("checkpoint_id");
    text_or_none(checkpoint_id);
    out.str("save_id");
    text_or_none(options_.save_id);
    out.str("load_id");
    out.op(Op::NONE);
  });
  out.op(Op::SETITEMS);
  out.op(Op::BUILD);
  std::string bytes = out.finish();
  release(std::move(s_));  // its memo of 10^5 texts: left to the exit when the tool leaves memory to it
  return bytes;
}

namespace {

// One rank's data file being written inside the staging folder.
struct DataFile {
  std::string relative_path;
  std::unique_ptr<AtomicFile> out;
  bool flush_each = false;  // its buffer written and freed after each item (many files open: see kBufferedFiles)
};

// Up to this many data files written at once keep their write buffers (1 MiB each) between items; beyond, each
// item is written out and its file's buffer freed, so a thousand ranks' files hold no buffers. An item at a time
// cost a write and a buffer grown afresh per item: a fifth of a 100,000-tensor rewrite's system time.
constexpr size_t kBufferedFiles = 16;

// Where the next item of `f` goes.
StorageInfo next_item(const DataFile& f) {
  StorageInfo s;
  s.relative_path = f.relative_path;
  s.offset = f.out->offset();
  return s;
}

// Appends one item to `f`, returning its storage info.
StorageInfo append_bytes(DataFile& f, std::span<const uint8_t> bytes) {
  StorageInfo s = next_item(f);
  s.length = bytes.size();
  f.out->write(bytes);
  if (f.flush_each) f.out->flush();  // frees the write buffer: the other ranks' files hold none while this one is written
  return s;
}

// Writes `chunk` as a torch.save zip straight into the data file (the zip's offsets count from the
// item's first byte, as torch.load of the item's bytes reads them): each tensor byte is written once.
StorageInfo append_tensor(DataFile& f, const Tensor& chunk, TensorZipWriter& zips) {
  StorageInfo s = next_item(f);
  s.length = zips.append(*f.out, own_storage(chunk));
  if (f.flush_each) f.out->flush();
  return s;
}

// The data files marked in `mine`, created in `dir` (the others: none).
std::vector<DataFile> open_data_files(const SavePlan& plan, const std::string& dir, const std::vector<char>& mine) {
  std::vector<DataFile> files(plan.files.size());
  const bool flush_each = static_cast<size_t>(std::count(mine.begin(), mine.end(), 1)) > kBufferedFiles;
  // Data files are written front to back and not read back by the run: with their buffers kept, they bypass the
  // page cache (O_DIRECT; the kernel's copy into the cache was a third of a 2.6 GB reshard's CPU). Flushed after
  // each item, a file could not keep its aligned blocks: through the cache.
  const AtomicFile::Cache cache = flush_each ? AtomicFile::Cache::keep : AtomicFile::Cache::bypass;
  for (size_t f = 0; f < plan.files.size(); ++f)
    if (mine.at(f))
      files[f] = {plan.files[f].relative_path,
                  std::make_unique<AtomicFile>((std::filesystem::path(dir) / plan.files[f].relative_path).string(),
                                               false, cache),
                  flush_each};
  return files;
}

}  // namespace

namespace {
// A write order lists every item of the plan once (each chunk of each tensor, each bytes entry).
void check_write_order(const SavePlan& plan, const std::string& out) {
  size_t items = 0;
  std::vector<std::vector<char>> seen(plan.entries.size());
  for (size_t k = 0; k < plan.entries.size(); ++k) {
    const size_t n = plan.entries[k].is_bytes ? 1 : plan.entries[k].chunks.size();
    seen[k].assign(n, 0);
    items += n;
  }
  for (const PlannedItem& it : plan.write_order) {
    const bool bytes = it.entry < plan.entries.size() && plan.entries[it.entry].is_bytes;
    const size_t c = bytes && it.chunk == PlannedItem::kBytes ? 0 : it.chunk;
    if (it.entry >= plan.entries.size() || c >= seen[it.entry].size() || seen[it.entry][c]++)
      fail(out, "DCP writer: the write order names an item twice or one the plan lacks (internal)");
  }
  if (plan.write_order.size() != items) fail(out, "DCP writer: the write order leaves items out (internal)");
}

constexpr size_t kBatchBytes = size_t{256} << 20;  // chunks made before they are written in parallel
constexpr size_t kParallelBytes = size_t{1} << 20;  // a batch smaller is written on this thread
}  // namespace

WriteResult write_dcp_files(const SavePlan& plan, const ChunkSource& source, const std::string& dir,
                            const std::vector<char>& mine, const std::string& out,
                            const std::function<void(const PlannedItem&, const StorageInfo&)>& written) {
  for (const Entry& e : plan.entries)
    if (!e.is_bytes) check_chunks_cover(e, out);
  // (entry, chunk) -> data file, at slot[entry] + chunk (a bytes entry: its one slot, chunk kBytes); kNoFile for an
  // item no file holds. Flat: a map of 10^5 items, looked up twice per item, was a tenth of the writing thread.
  constexpr size_t kNoFile = SIZE_MAX;
  std::vector<size_t> slot(plan.entries.size() + 1, 0);
  for (size_t k = 0; k < plan.entries.size(); ++k)
    slot[k + 1] = slot[k] + (plan.entries[k].is_bytes ? 1 : plan.entries[k].chunks.size());
  auto slot_of = [&](size_t entry, size_t chunk) -> std::optional<size_t> {
    if (entry >= plan.entries.size()) return std::nullopt;
    if (plan.entries[entry].is_bytes)
      return chunk == PlannedItem::kBytes ? std::optional<size_t>(slot[entry]) : std::nullopt;
    return chunk < plan.entries[entry].chunks.size() ? std::optional<size_t>(slot[entry] + chunk) : std::nullopt;
  };
  std::vector<size_t> file_of(slot.back(), kNoFile);
  size_t items = 0;  // this process's
  for (size_t f = 0; f < plan.files.size(); ++f) {
    if (mine.at(f)) items += plan.files[f].items.size();
    for (const PlannedItem& it : plan.files[f].items)
      if (const auto at = slot_of(it.entry, it.chunk)) file_of[*at] = f;
  }
  std::vector<DataFile> files = open_data_files(plan, dir, mine);
  WriteResult result;
  result.storage.reserve(items);
  result.order.reserve(items);
  auto file_index = [&](size_t entry, size_t chunk) {
    const auto at = slot_of(entry, chunk);
    if (!at || file_of[*at] == kNoFile)
      fail(out, "DCP writer: the plan puts '" + escaped_brief(plan.entries[entry].fqn) + "' in no data file");
    return file_of[*at];
  };
  auto place = [&](size_t entry, size_t chunk) -> DataFile& { return files[file_index(entry, chunk)]; };
  // The chunks are made one after another (the source is called in write order), a batch of at most one chunk per data
  // file and kBatchBytes, then written file by file in parallel: the chunks of one tensor are mostly its TP pieces,
  // each for another rank's file, and the writes (the kernel's copy into the page cache, each zip's CRC-32) were most
  // of a conversion. Each file still gets its items in write order, so the files are the same bytes as written in turn.
  struct Made {
    PlannedItem at;
    Tensor t;
  };
  std::vector<Made> batch;
  std::vector<char> in_batch(files.size(), 0);  // a file already has a chunk of the batch
  TensorZipWriter zips;                         // the small items' zips, made once per tensor signature
  size_t batch_bytes = 0;
  auto write_batch = [&] {
    std::vector<StorageInfo> info(batch.size());
    auto write_one = [&](size_t i) {
      info[i] = append_tensor(place(batch[i].at.entry, batch[i].at.chunk), batch[i].t, zips);
      batch[i].t = Tensor();
    };
    // Threads only for chunks worth waking them: for 100,000 chunks of 8 bytes, the workers spinning between
    // batches cost a sixth of the rewrite's CPU.
    if (batch.size() > 1 && batch_bytes >= kParallelBytes) tbb::parallel_for(size_t{0}, batch.size(), write_one);
    else
      for (size_t i = 0; i < batch.size(); ++i) write_one(i);
    for (size_t i = 0; i < batch.size(); ++i) {
      const PlannedItem& at = batch[i].at;
      if (written) written(at, info[i]);
      result.storage.push_back(std::move(info[i]));
      result.order.push_back({at.entry, at.chunk});
    }
    batch.clear();
    std::fill(in_batch.begin(), in_batch.end(), 0);
    batch_bytes = 0;
  };
  auto write_item = [&](size_t k, size_t c) {
    check_interrupted();
    const Entry& e = plan.entries[k];
    if (e.is_bytes) {
      if (!mine[file_index(k, PlannedItem::kBytes)]) return;
      write_batch();  // the items before it first: each file's items stay in write order
      const std::vector<uint8_t> b = source.bytes(e);
      result.storage.push_back(append_bytes(place(k, PlannedItem::kBytes), b));
      if (written) written({k, PlannedItem::kBytes}, result.storage.back());
      result.order.push_back({k, PlannedItem::kBytes});
      return;
    }
    const size_t f = file_index(k, c);
    if (!mine[f]) return;  // another process's file
    if (in_batch[f]) write_batch();  // one chunk per file
    in_batch[f] = 1;
    Tensor t = source.chunk(e, c);
    if (t.dtype() != e.dtype || t.shape() != e.chunks[c].sizes)
      fail(out, "DCP writer: chunk " + std::to_string(c) + " of '" + escaped_brief(e.fqn) + "' from the source is a " +
                  std::string(dtype_name(t.dtype())) + " tensor of shape " + shape_str(t.shape()) + ", the plan says " +
                  std::string(dtype_name(e.dtype)) + " " + shape_str(e.chunks[c].sizes));
    // A small chunk of a mapped file: its bytes asked for now, read when the batch is written (one or two chunks on;
    // the first touch of each of 10^5 chunks of 8 bytes, the zip's CRC-32 of them, waited on memory).
    if (const auto& st = t.storage(); st && st->is_mapped() && t.nbytes() <= 256)
      __builtin_prefetch(st->mapped_file()->data() + st->mapped_offset());
    batch_bytes += static_cast<size_t>(t.nbytes());
    batch.push_back({{k, c}, std::move(t)});
    if (batch_bytes >= kBatchBytes) write_batch();
  };
  if (!plan.write_order.empty()) {
    check_write_order(plan, out);
    for (const PlannedItem& it : plan.write_order) write_item(it.entry, it.chunk);
  } else {
    for (size_t k = 0; k < plan.entries.size(); ++k) {
      const Entry& e = plan.entries[k];
      if (e.is_bytes) write_item(k, PlannedItem::kBytes);
      for (size_t c = 0; !e.is_bytes && c < e.chunks.size(); ++c) write_item(k, c);
      write_batch();  // a batch holds one entry's chunks (a materialized source keeps one tensor alive)
    }
  }
  write_batch();
  for (DataFile& f : files) {
    if (!f.out) continue;
    result.bytes += f.out->offset();
    f.out->commit();
  }
  return result;
}

namespace {

// `written`'s items added to `head` by their places in the plan, in plan order (each process wrote its own files'
// items in that order; together, any order): the plan already says which entry and chunk each is.
void add_in_plan_order(MetadataPickle& head, const WriteResult& written) {
  std::vector<size_t> by_plan(written.storage.size());
  for (size_t i = 0; i < by_plan.size(); ++i) by_plan[i] = i;
  std::sort(by_plan.begin(), by_plan.end(),
            [&](size_t a, size_t b) { return written.order.at(a) < written.order.at(b); });
  for (size_t i : by_plan) head.add(PlannedItem{written.order[i].first, written.order[i].second}, written.storage[i]);
}

}  // namespace

std::string metadata_pickle(const SavePlan& plan, const WriteResult& written, const WriteOptions& options,
                            const std::string& checkpoint_id) {
  MetadataPickle head(plan, options);
  add_in_plan_order(head, written);
  return head.finish(checkpoint_id);
}

namespace {

// What `.metadata` records as where it was saved: the options', else the output folder's absolute path.
std::string saved_at(const std::string& out, const WriteOptions& options) {
  return options.checkpoint_id.empty() ? std::filesystem::absolute(out).lexically_normal().string() : options.checkpoint_id;
}

// `.metadata`, past a few MiB as the data files are written: not through the page cache (the kernel's copy of the
// 30 MB of 100,000 tensors' was a tenth of the writing thread's last part), nothing in the run reads it back.
constexpr size_t kDirectFrom = size_t{4} << 20;
void write_metadata_file(const std::string& path, std::string_view pickled) {
  write_file_atomic(path, pickled, false,
                    pickled.size() >= kDirectFrom ? AtomicFile::Cache::bypass : AtomicFile::Cache::keep);
}

// A large `.metadata` written as it is pickled: what the plan alone gives and each batch of items go to the file
// (its full blocks to the disk) while the data files are written, and only its last part is left once they are
// (written after them, the 30 MB of 100,000 tensors' were the run's last 0.015-0.025 s, the disk's alone).
class MetadataFile {
 public:
  explicit MetadataFile(const std::string& path) : file_(path, false, AtomicFile::Cache::bypass) {}
  void take(std::string_view pickled) {  // `pickled`: the pickle so far, of which the front was taken before
    file_.write(pickled.data() + taken_, pickled.size() - taken_);
    taken_ = pickled.size();
  }
  void commit(std::string_view pickled) {
    take(pickled);
    file_.commit();
  }

 private:
  AtomicFile file_;
  size_t taken_ = 0;
};

// Items passed from the thread writing the data files to the one pickling `.metadata`, in batches of kBatch (a
// wake per item of 100,000 is not worth it).
class ItemQueue {
 public:
  static constexpr size_t kBatch = 256;
  struct Written {
    PlannedItem at;
    StorageInfo storage;
  };
  void push(const PlannedItem& at, const StorageInfo& storage) {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back({at, storage});
    if (items_.size() == kBatch) cv_.notify_one();
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    cv_.notify_one();
  }
  // The next items into `out` (a batch, or what is left once closed); false when closed and none are left.
  bool take(std::deque<Written>& out) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return closed_ || items_.size() >= kBatch; });
    out = std::exchange(items_, {});
    return !out.empty() || !closed_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Written> items_;
  bool closed_ = false;
};

}  // namespace

void write_dcp_metadata(const SavePlan& plan, const WriteResult& written, const std::string& dir,
                        const std::string& out, const WriteOptions& options, MetadataPickle* head) {
  std::optional<MetadataPickle> own;
  if (!head) head = &own.emplace(plan, options);
  add_in_plan_order(*head, written);
  write_metadata_file((std::filesystem::path(dir) / ".metadata").string(), head->finish(saved_at(out, options)));
}

WriteResult write_dcp(const SavePlan& plan, const ChunkSource& source, const std::string& out, const WriteOptions& options) {
  StagingDir stage(out, options.overwrite, "dcp", {}, options.durable);
  // `.metadata` is pickled on a thread of its own while the data files are written: first what the plan alone gives,
  // then each item as it is written when they come in plan order (the plan has no write order of its own), the
  // order `.metadata` lists them in. On 100,000 tensors the pickling was a quarter of the rewrite, on one core while
  // the other waited.
  const bool streamed = plan.write_order.empty();
  const std::string metadata_path = (stage.path() / ".metadata").string();
  std::optional<MetadataPickle> head;
  std::optional<MetadataFile> head_file;  // streamed and large: written as it is pickled
  std::exception_ptr head_error;
  ItemQueue queue;
  std::jthread head_thread([&] {
    try {
      head.emplace(plan, options);
      if (streamed && pickle_size_hint(plan) >= kDirectFrom) head_file.emplace(metadata_path);
      if (head_file) head_file->take(head->so_far());
      for (std::deque<ItemQueue::Written> batch; streamed && queue.take(batch);) {
        for (const auto& w : batch) head->add(w.at, w.storage);
        if (head_file) head_file->take(head->so_far());
      }
    } catch (...) {
      head_error = std::current_exception();
    }
  });
  WriteResult result;
  try {
    std::function<void(const PlannedItem&, const StorageInfo&)> written;
    if (streamed) written = [&queue](const PlannedItem& at, const StorageInfo& storage) { queue.push(at, storage); };
    result = write_dcp_files(plan, source, stage.path().string(), std::vector<char>(plan.files.size(), 1), out,
                             written);
  } catch (...) {
    queue.close();  // the pickling thread ends; joined on the way out
    throw;
  }
  queue.close();
  head_thread.join();
  if (head_error) std::rethrow_exception(head_error);
  if (streamed && std::is_sorted(result.order.begin(), result.order.end())) {
    const std::string pickled = head->finish(saved_at(out, options));
    if (head_file) head_file->commit(pickled);
    else write_metadata_file(metadata_path, pickled);
  } else {  // items sorted into plan order first (a plan with a write order; a streamed one never comes out of order)
    head_file.reset();  // what it wrote: removed
    write_dcp_metadata(plan, result, stage.path().string(), out, options, streamed ? nullptr : &*head);
  }
  stage.commit();
  return result;
}

}  // namespace ucpkit::formats::dcp
