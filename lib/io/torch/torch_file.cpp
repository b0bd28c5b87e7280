// torch.save files: zip and legacy containers.
#include "io/torch/torch_file.h"
#include "io/torch/verify.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <set>
#include <tuple>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "io/pickle/opcodes.h"
#include "io/pickle/pickler.h"
#include "io/pickle/unpickler.h"
#include "io/zip/zip_reader.h"
#include "io/zip/zip_records.h"
#include "io/zip/zip_writer.h"

namespace ucpkit {
namespace {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

// A persistent id's storage part: (storage class, key, location, numel).
struct StorageId {
  DType dtype;
  std::string key, location;
  int64_t numel;
};

StorageId parse_storage_id(const ValuePtr& pid, const std::string& path, size_t min_items) {
  if (pid->kind != Kind::Tuple || pid->items.size() < min_items)
    fail(path, "persistent id is not a storage tuple: " + pid->repr(1));
  const auto& it = pid->items;
  if (it[0]->kind != Kind::Str || it[0]->s != "storage") fail(path, "unsupported persistent id " + pid->repr(1));
  if (it[1]->kind != Kind::Global) fail(path, "storage type is not a class: " + it[1]->repr(1));
  std::optional<DType> dt = it[1]->name == "UntypedStorage" ? std::optional<DType>(DType::UInt8)
                                                          : dtype_from_storage_class(it[1]->name);
  if (!dt) fail(path, "unsupported storage type " + it[1]->class_path());
  StorageId id{*dt, it[2]->kind == Kind::Str ? it[2]->s : std::to_string(it[2]->as_int()),
               it[3]->kind == Kind::Str ? it[3]->s : "cpu", it[4]->as_int()};
  if (id.numel < 0) fail(path, "negative storage size for key '" + id.key + "'");
  return id;
}

ValuePtr storage_value(std::shared_ptr<Storage> s) {
  // A bare storage is represented as a 1-D tensor over all of it.
  int64_t n = s->numel();
  return Value::of_tensor(Tensor(std::move(s), 0, {n}, {1}));
}

// torch >= 2.1 records the saving host's byte order (torch/serialization.py `_save`: the "byteorder"
// record, sys.byteorder); `_load` byte-swaps every storage whose record differs from the loading host
// (load_tensor: `if byteorderdata.decode() != sys.byteorder: storage.byteswap(dtype)`). Files without
// the record load as little-endian (torch's default load endianness). Returns true for "big".
bool big_endian_storages(const ZipReader& zip, const std::string& path) {
  const auto rec = zip.find("byteorder");
  if (!rec) return false;
  const auto b = zip.bytes(*rec);
  const std::string order(b.begin(), b.end());
  if (order == "little") return false;
  if (order == "big") return true;
  fail(path, "zip: unknown byte order " + escaped_brief(order) + " in record 'byteorder' (torch writes little or big)");
}

// A big-endian storage as this (little-endian) host reads it: element bytes reversed, owned in memory
// (the one case where a storage is not a zero-copy view of the file).
std::shared_ptr<Storage> swapped_storage(DType dtype, int64_t numel, const MappedFile& file, uint64_t offset) {
  const size_t width = dtype_size(dtype);
  const auto src = file.bytes().subspan(offset, static_cast<size_t>(numel) * width);
  std::vector<uint8_t> bytes(src.begin(), src.end());
  for (size_t e = 0; e + width <= bytes.size(); e += width) std::reverse(bytes.begin() + e, bytes.begin() + e + width);
  return Storage::owned(dtype, std::move(bytes));
}

TorchFile load_zip(std::shared_ptr<const MappedFile> file, const TorchLoadOptions& options) {
  const std::string& path = file->path();
  ZipReader zip(file);
  auto pkl = zip.find("data.pkl");
  if (!pkl) fail(path, "zip: no data.pkl record");
  const bool big_endian = big_endian_storages(zip, path);
  if (options.verify_crc)
    for (const auto& [name, rec] : zip.records())
      if (crc32_parallel(zip.bytes(rec)) != rec.crc32) fail(path, "zip: CRC-32 mismatch in record '" + name + "'");

  std::unordered_map<std::string, std::shared_ptr<Storage>> storages;
  pickle::UnpickleOptions uo;
  uo.persistent_load = [&](const ValuePtr& pid) -> ValuePtr {
    StorageId id = parse_storage_id(pid, path, 5);
    auto it = storages.find(id.key);
    if (it != storages.end()) {
      if (it->second->dtype() != id.dtype) fail(path, "storage '" + id.key + "' is used with two dtypes");
      return storage_value(it->second);
    }
    auto rec = zip.find("data/" + id.key);
    if (!rec) fail(path, "storage record 'data/" + id.key + "' is missing");
    uint64_t need = static_cast<uint64_t>(id.numel) * dtype_size(id.dtype);
    if (id.numel > 0 && (need / dtype_size(id.dtype) != static_cast<uint64_t>(id.numel) || rec->size < need))
      fail(path, "storage record 'data/" + id.key + "' holds " + std::to_string(rec->size) + " bytes but its " +
                     std::to_string(id.numel) + " " + std::string(dtype_name(id.dtype)) + " elements need " +
                     std::to_string(need));
    auto s = big_endian ? swapped_storage(id.dtype, id.numel, *file, rec->data_offset)
                        : Storage::mapped(id.dtype, id.numel, file, rec->data_offset);
    s->key = id.key;
    s->location = id.location;
    storages.emplace(id.key, s);
    return storage_value(s);
  };
  TorchFile tf;
  tf.root = pickle::unpickle(zip.bytes(*pkl), path, uo);
  tf.container = TorchContainer::Zip;
  tf.archive_prefix = zip.prefix();
  tf.file = std::move(file);
  return tf;
}

// Legacy format: pickles of magic number, protocol version, sys info, the object, the storage keys;
// then each storage as an int64 element count followed by its bytes.
TorchFile load_legacy(std::shared_ptr<const MappedFile> file) {
  const std::string& path = file->path();
  auto data = file->bytes();
  // Protocol 2+ pickles start with PROTO; protocols 0/1 pickle the magic number as a text LONG.
  if (data.size() < 2 || (data[0] != pickle::op_byte(pickle::Op::PROTO) && data[0] != pickle::op_byte(pickle::Op::LONG)))
    fail(path, "not a torch file (wrong magic: neither zip nor pickle)");
  size_t pos = 0, used = 0;
  auto next = [&](const pickle::UnpickleOptions& o) {
    ValuePtr v = pickle::unpickle(data.subspan(pos), path, o, &used);
    pos += used;
    return v;
  };
  pickle::UnpickleOptions plain;
  ValuePtr magic = next(plain);
  // 0x1950a86a20f9469cfc6c, as LONG1 little-endian bytes.
  static const std::string kMagic("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10);
  if (magic->kind != Kind::BigInt || magic->s != kMagic) fail(path, "not a torch file (wrong magic number)");
  ValuePtr proto = next(plain);
  if (proto->kind != Kind::Int || proto->i != 1001)
    fail(path, "unsupported legacy protocol version " + proto->repr(1));
  // sys info: torch 1.x's legacy save records the host's byte order (torch/serialization.py
  // _legacy_save: little_endian=sys.byteorder == 'little') and its loader does not swap: refuse.
  const ValuePtr sys_info = next(plain);
  if (sys_info->kind == Kind::Dict)
    if (ValuePtr le = sys_info->get("little_endian"); le && le->kind == Kind::Bool && !le->b)
      fail(path, "written on a big-endian host (legacy format, sys_info little_endian=False): not supported");

  struct Root {
    std::shared_ptr<Storage> storage;
    std::vector<std::pair<std::shared_ptr<Storage>, int64_t>> views;  // storage, element offset
  };
  std::map<std::string, Root> roots;
  pickle::UnpickleOptions uo;
  uo.persistent_load = [&](const ValuePtr& pid) -> ValuePtr {
    if (pid->kind == Kind::Tuple && !pid->items.empty() && pid->items[0]->kind == Kind::Str &&
        pid->items[0]->s == "module")
      return Value::none();  // source of a pickled nn.Module class: not needed
    StorageId id = parse_storage_id(pid, path, 6);
    Root& root = roots[id.key];
    if (!root.storage) {
      root.storage = Storage::unbound(id.dtype, id.numel);
      root.storage->key = id.key;
      root.storage->location = id.location;
    } else if (root.storage->dtype() != id.dtype) {
      fail(path, "storage '" + id.key + "' is used with two dtypes");
    }
    const ValuePtr& view = pid->items[5];
    if (view->is_none()) return storage_value(root.storage);
    if (!view->is_sequence() || view->items.size() != 3) fail(path, "bad storage view metadata");
    int64_t offset = view->items[1]->as_int(), size = view->items[2]->as_int();
    if (offset < 0 || size < 0 || offset > root.storage->numel() || size > root.storage->numel() - offset)
      fail(path, "storage view outside its storage '" + id.key + "'");
    auto v = Storage::unbound(id.dtype, size);
    v->key = id.key;
    v->location = id.location;
    root.views.emplace_back(v, offset);
    return storage_value(v);
  };
  TorchFile tf;
  tf.root = next(uo);
  ValuePtr keys = next(plain);
  if (keys->kind != Kind::List) fail(path, "legacy storage key list is missing");
  for (const auto& k : keys->items) {
    std::string key = k->kind == Kind::Str ? k->s : std::to_string(k->as_int());
    if (pos + 8 > data.size()) fail(path, "truncated: storage '" + key + "' header past the end of the file");
    uint64_t count = 0;
    for (int b = 0; b < 8; ++b) count |= static_cast<uint64_t>(data[pos + b]) << (8 * b);
    pos += 8;
    auto it = roots.find(key);
    if (it == roots.end()) fail(path, "storage '" + key + "' is listed but never used (element size unknown)");
    Root& root = it->second;
    const size_t es = dtype_size(root.storage->dtype());
    if (count > (data.size() - pos) / es) fail(path, "truncated: storage '" + key + "' runs past the end of the file");
    if (count < static_cast<uint64_t>(root.storage->numel()))
      fail(path, "storage '" + key + "' holds " + std::to_string(count) + " elements, its tensors need " +
                     std::to_string(root.storage->numel()));
    root.storage->bind(file, pos);
    for (auto& [view, offset] : root.views) view->bind(file, pos + static_cast<uint64_t>(offset) * es);
    pos += count * es;
  }
  for (const auto& [key, root] : roots)
    if (!root.storage->is_bound()) fail(path, "storage '" + key + "' has no data in the file");
  tf.container = TorchContainer::Legacy;
  tf.file = std::move(file);
  return tf;
}

TorchFile load_any(std::shared_ptr<const MappedFile> file, const TorchLoadOptions& options) {
  if (file->size() == 0) fail(file->path(), "empty file");
  if (looks_like_zip(file->bytes())) return load_zip(std::move(file), options);
  return load_legacy(std::move(file));
}

// Every failure is reported as an Error that names the file.
TorchFile load_guarded(const std::string& name, const std::function<TorchFile()>& load) {
  try {
    return load();
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.rfind(name + ":", 0) == 0) throw;
    throw Error(name + ": " + msg);
  } catch (const std::bad_alloc&) {
    throw Error(name + ": out of memory while reading (absurd sizes?)");
  } catch (const std::length_error& e) {
    throw Error(name + ": absurd size (" + std::string(e.what()) + ")");
  }
}

}  // namespace

namespace {

std::atomic<bool> g_verify_files_crc{true};
// Files whose CRCs were checked in this process (path, size, mtime): a tool that opens a shard once
// to plan and once to copy checks it once.
std::mutex g_verified_mu;
std::set<std::tuple<std::string, int64_t, int64_t>> g_verified;

std::tuple<std::string, int64_t, int64_t> file_identity(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {path, -1, -1};
  return {path, static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// Every record's CRC-32 against the central directory, in windows each dropped from the resident
// set once summed (a file larger than memory is not faulted in whole; the copy reads it again from
// the page cache).
void check_record_crcs(const std::shared_ptr<const MappedFile>& file) {
  ZipReader zip(file);
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kWindow = 64ull << 20;
  for (const auto& [name, rec] : zip.records()) {
    uint32_t crc = 0;
    for (uint64_t off = 0; off < rec.size; off += kWindow) {
      const auto bytes = zip.bytes(rec).subspan(static_cast<size_t>(off), static_cast<size_t>(std::min(kWindow, rec.size - off)));
      crc = crc32_parallel(bytes, crc);
      const uintptr_t lo = (reinterpret_cast<uintptr_t>(bytes.data()) + page - 1) / page * page;
      const uintptr_t hi = (reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size()) / page * page;
      if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    }
    if (crc != rec.crc32)
      fail(file->path(), "zip: CRC-32 mismatch in record '" + name + "' (the file is damaged; --no-verify skips this check)");
  }
}

}  // namespace

void set_verify_files_crc(bool on) { g_verify_files_crc = on; }
bool verify_files_crc() { return g_verify_files_crc; }

size_t files_crc_checked_at_open() {
  std::lock_guard<std::mutex> lock(g_verified_mu);
  return g_verified.size();
}

TorchFile load_torch_file(const std::string& path, const TorchLoadOptions& options) {
  std::tuple<std::string, int64_t, int64_t> id{"", -1, -1};
  bool check = false;
  if (!options.verify_crc && options.crc_at_open && g_verify_files_crc) {
    id = file_identity(path);
    std::lock_guard<std::mutex> lock(g_verified_mu);
    check = !g_verified.count(id);
  }
  TorchFile tf = load_guarded(path, [&] {
    auto file = MappedFile::open(path);
    if (check && looks_like_zip(file->bytes())) check_record_crcs(file);
    return load_any(std::move(file), options);
  });
  if (check && std::get<1>(id) >= 0) {
    std::lock_guard<std::mutex> lock(g_verified_mu);
    g_verified.insert(id);
  }
  return tf;
}

TorchFile load_torch_bytes(std::span<const uint8_t> bytes, const std::string& name, const TorchLoadOptions& options) {
  return load_guarded(name, [&] { return load_any(MappedFile::from_bytes(bytes, name), options); });
}

TorchFile load_torch_mapped(std::shared_ptr<const MappedFile> file, const TorchLoadOptions& options) {
  const std::string name = file->path();
  return load_guarded(name, [&] { return load_any(std::move(file), options); });
}

pickle::ValuePtr load_torch(const std::string& path, const TorchLoadOptions& options) {
  return load_torch_file(path, options).root;
}

namespace {

// Pickles `root`, numbering its distinct storages in order of first appearance.
std::string pickle_root(const pickle::ValuePtr& root, std::vector<std::shared_ptr<Storage>>& order) {
  std::unordered_map<const Storage*, std::string> keys;
  pickle::PickleOptions po;
  po.storage_id = [&](const std::shared_ptr<Storage>& s) -> ValuePtr {
    auto it = keys.find(s.get());
    if (it == keys.end()) {
      it = keys.emplace(s.get(), std::to_string(order.size())).first;
      order.push_back(s);
    }
    return Value::tuple({Value::str("storage"), Value::global("torch", std::string(dtype_storage_class(s->dtype()))),
                         Value::str(it->second), Value::str(s->location.empty() ? "cpu" : s->location),
                         Value::integer(s->numel())});
  };
  return pickle::pickle(root, po);
}

std::span<const uint8_t> text_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// torch >= 2.0's `.data/serialization_id`: 40 decimal digits, a 20-digit hash of the record names
// and 20 digits of a CRC (caffe2/serialize/inline_container.cc writeSerializationId). torch hashes
// with c10::hash and combines the CRCs of every record; it never reads the id back. Ours is
// FNV-1a over the names and the CRC-32 of data.pkl, known before the storages are written (the
// deferred writer fills them later), so the id is deterministic for a given pickle.
std::string serialization_id(const std::vector<std::string>& names, const std::string& pkl) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& n : names) {
    for (unsigned char c : n) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%020llu%020llu", static_cast<unsigned long long>(h),
                static_cast<unsigned long long>(crc32_update(0, text_bytes(pkl))));
  return buf;
}

// Writes the records of a torch file in torch >= 2.0 torch.save's order (torch/serialization.py
// _save: data.pkl, .format_version "1", .storage_alignment "64", byteorder, data/<key> in key order;
// then PyTorchStreamWriter::writeEndOfFile: version "3\n", .data/serialization_id). torch 1.13 reads
// such files (it ignores the records it does not know). `generated(k, storage)` handles each
// generated storage (streamed now, or reserved for later).
void write_records(ZipWriter& zip, const std::string& prefix, const std::string& pkl,
                   const std::vector<std::shared_ptr<Storage>>& order,
                   const std::function<void(const std::string&, const std::shared_ptr<Storage>&)>& generated) {
  std::vector<std::string> names;
  auto text = [&](const std::string& name, const std::string& value) {
    names.push_back(name);
    zip.add(prefix + "/" + name, text_bytes(value));
  };
  text("data.pkl", pkl);
  text(".format_version", "1");
  text(".storage_alignment", "64");
  text("byteorder", "little");
  for (size_t k = 0; k < order.size(); ++k) {
    names.push_back("data/" + std::to_string(k));
    const std::string name = prefix + "/" + names.back();
    if (order[k]->is_generated())
      generated(name, order[k]);
    else
      zip.add(name, order[k]->bytes());
  }
  text("version", "3\n");
  const std::string id = serialization_id(names, pkl);
  text(".data/serialization_id", id);
}

}  // namespace

void save_torch_file(const std::string& path, const pickle::ValuePtr& root, const TorchSaveOptions& options) {
  std::vector<std::shared_ptr<Storage>> order;
  const std::string pkl = pickle_root(root, order);
  ZipWriter zip(path, options.durable, options.start_writeback);
  write_records(zip, options.archive_prefix, pkl, order, [&](const std::string& name, const std::shared_ptr<Storage>& st) {
    if (st->is_zero()) return zip.add_zeros(name, st->nbytes());  // a hole: nothing to write
    zip.add_streamed(name, st->nbytes(), [&st](uint64_t off, std::span<uint8_t> w) { st->generate(off, w); },
                     dtype_size(st->dtype()));
  });
  zip.finish();
}

uint64_t append_torch_file(AtomicFile& out, const pickle::ValuePtr& root, const TorchSaveOptions& options) {
  std::vector<std::shared_ptr<Storage>> order;
  const std::string pkl = pickle_root(root, order);
  const uint64_t start = out.offset();
  ZipWriter zip(out);
  write_records(zip, options.archive_prefix, pkl, order, [&](const std::string& name, const std::shared_ptr<Storage>& st) {
    if (st->is_zero()) return zip.add_zeros(name, st->nbytes());  // a hole: nothing to write
    zip.add_streamed(name, st->nbytes(), [&st](uint64_t off, std::span<uint8_t> w) { st->generate(off, w); },
                     dtype_size(st->dtype()));
  });
  zip.finish();
  return out.offset() - start;
}

// A tensor's zip as append_torch_file writes it, with the place of its data record's bytes and of the
// two copies of that record's CRC-32 (local header, central directory).
struct TensorZipWriter::Template {
  std::string zip;
  uint64_t data = 0, size = 0, header_crc = 0, directory_crc = 0;
};

namespace {
std::atomic<uint64_t> g_zip_writer_serial{0};
}  // namespace

TensorZipWriter::TensorZipWriter(TorchSaveOptions options)
    : options_(std::move(options)), serial_(g_zip_writer_serial.fetch_add(1) + 1) {}
TensorZipWriter::~TensorZipWriter() = default;

uint64_t TensorZipWriter::append(AtomicFile& out, const Tensor& t) {
  const std::shared_ptr<Storage>& st = t.storage();
  if (!st || st->is_zero() || st->nbytes() > kMaxBytes) return append_torch_file(out, Value::of_tensor(t), options_);
  // Everything the pickle and the records depend on but the storage's bytes (Pickler::tensor, pickle_root), in a
  // buffer of the thread's; the thread's four latest templates are taken again without the lock when the key is one of
  // theirs (a DCP file's items mostly share a few; the key's allocation, hash and lock were an eighth of this
  // function's instructions in a 100,000-tensor rewrite).
  struct Recent {
    uint64_t writer = 0;
    std::string key;
    std::shared_ptr<const Template> tp;
  };
  thread_local struct {
    std::string key;
    std::array<Recent, 4> recent;  // a file's items take turns among a few (a tensor's chunks, its step's scalar)
    size_t next = 0;
  } mine;
  std::string& key = mine.key;
  key.resize((5 + t.shape().size() + t.strides().size()) * sizeof(int64_t) + st->location.size());  // room kept
  char* at = key.data();
  auto add = [&at](int64_t v) {
    std::memcpy(at, &v, sizeof v);
    at += sizeof v;
  };
  add(static_cast<int64_t>(st->dtype()));
  add(st->numel());
  add(t.storage_offset());
  add(static_cast<int64_t>(t.shape().size()));
  for (int64_t d : t.shape()) add(d);
  for (int64_t d : t.strides()) add(d);
  add((t.is_parameter ? 1 : 0) | (t.requires_grad ? 2 : 0));
  std::memcpy(at, st->location.data(), st->location.size());
  // A generated storage's bytes made here (small: kMaxBytes at most).
  thread_local std::vector<uint8_t> made;
  std::span<const uint8_t> bytes;
  if (st->is_generated()) {
    made.resize(st->nbytes());
    st->generate(0, made);
    bytes = made;
  } else {
    bytes = st->bytes();
  }
  std::shared_ptr<const Template> known;
  for (const Recent& r : mine.recent)
    if (r.writer == serial_ && r.key == key) {
      known = r.tp;
      break;
    }
  if (!known) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = templates_.find(key); it != templates_.end()) known = it->second;
  }
  if (!known) {
    auto tp = std::make_shared<Template>();
    std::vector<std::shared_ptr<Storage>> order;
    const std::string pkl = pickle_root(Value::of_tensor(t), order);
    ZipWriter zip(&tp->zip);
    write_records(zip, options_.archive_prefix, pkl, order, [&](const std::string& name, const std::shared_ptr<Storage>&) {
      zip.add(name, bytes);
    });
    zip.finish();
    const auto place = zip.place(options_.archive_prefix + "/data/0");
    if (order.size() != 1 || !place || place->size != bytes.size())
      throw Error("internal: a tensor's zip without its one data record");
    tp->data = place->data;
    tp->size = place->size;
    tp->header_crc = place->header + kLocalCrcField;
    tp->directory_crc = place->directory + kCentralCrcField;
    known = tp;
    std::lock_guard<std::mutex> lock(mu_);
    if (kept_ + tp->zip.size() <= kMaxKept && templates_.emplace(key, tp).second) kept_ += tp->zip.size();
  }
  if (std::none_of(mine.recent.begin(), mine.recent.end(), [&](const Recent& r) { return r.tp == known; })) {
    Recent& r = mine.recent[mine.next++ % mine.recent.size()];
    r = {serial_, key, known};
  }
  const Template& tp = *known;
  const uint32_t crc = st->crc32 && st->is_mapped() ? *st->crc32 : crc32_parallel(bytes);  // bytes: all of st's
  uint8_t le[4];
  for (int k = 0; k < 4; ++k) le[k] = static_cast<uint8_t>(crc >> (8 * k));
  const auto* z = reinterpret_cast<const uint8_t*>(tp.zip.data());
  if (const std::span<uint8_t> at = out.room(tp.zip.size()); at.size() == tp.zip.size()) {
    // Made in the block being filled: the template, then its data record's bytes and CRC-32s (seven writes a tensor
    // were a third of this function's instructions).
    std::memcpy(at.data(), z, tp.zip.size());
    std::memcpy(at.data() + tp.header_crc, le, 4);
    std::memcpy(at.data() + tp.directory_crc, le, 4);
    std::memcpy(at.data() + tp.data, bytes.data(), bytes.size());
    out.filled(tp.zip.size());
    return tp.zip.size();
  }
  auto piece = [&](uint64_t from, uint64_t to) { out.write(std::span<const uint8_t>(z + from, to - from)); };
  piece(0, tp.header_crc);
  out.write(std::span<const uint8_t>(le, 4));
  piece(tp.header_crc + 4, tp.data);
  out.write(bytes);
  piece(tp.data + tp.size, tp.directory_crc);
  out.write(std::span<const uint8_t>(le, 4));
  piece(tp.directory_crc + 4, tp.zip.size());
  return tp.zip.size();
}

// A remembered zip: its bytes, the ranges every matching zip shares with it, its data record and serialization id
// (records whose bytes and CRC-32 differ), and the tensor it holds (its storage's offset counted from the zip's
// first byte).
struct TensorZipReader::Template {
  struct Hole {
    uint64_t data = 0, size = 0;
    std::vector<uint64_t> crcs;  // where the record's CRC-32 is written: its central entry, and its data descriptor
                                 // or (no descriptor) its local header
  };
  std::string zip;
  std::vector<std::pair<uint64_t, uint64_t>> same;  // [from, to)
  Hole data;
  std::optional<Hole> id;
  DType dtype = DType::Float32;
  int64_t numel = 0, storage_offset = 0;
  std::vector<int64_t> shape, strides;
  bool is_parameter = false, requires_grad = false, verified = false;
  std::string key, location, record;
};

namespace {
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
}  // namespace

const TensorZipReader::Template* TensorZipReader::find(const std::shared_ptr<const MappedFile>& file, uint64_t offset,
                                                       uint64_t length, bool verify, uint32_t& crc) const {
  const auto it = templates_.find(length);
  if (it == templates_.end()) return nullptr;
  const uint8_t* z = file->data() + offset;
  // Each hole's CRC-32, the same in every place it is written.
  auto crc_of = [z](const Template::Hole& h) -> std::optional<uint32_t> {
    const uint32_t c = le32(z + h.crcs.front());
    for (uint64_t at : h.crcs)
      if (le32(z + at) != c) return std::nullopt;
    return c;
  };
  for (const auto& candidate : it->second) {
    const Template& tp = *candidate;
    if (verify && !tp.verified) continue;
    const auto* t = reinterpret_cast<const uint8_t*>(tp.zip.data());
    bool same = true;
    for (const auto& [from, to] : tp.same) same = same && std::memcmp(z + from, t + from, to - from) == 0;
    const auto data_crc = same ? crc_of(tp.data) : std::nullopt;
    if (!data_crc) continue;
    if (tp.id) {
      const auto id_crc = crc_of(*tp.id);
      if (!id_crc || (verify && crc32_update(0, {z + tp.id->data, tp.id->size}) != *id_crc))
        return nullptr;  // parsed again, and named there
    }
    crc = *data_crc;
    return &tp;
  }
  return nullptr;
}

std::optional<TensorZipReader::Found> TensorZipReader::match(const std::shared_ptr<const MappedFile>& file,
                                                             uint64_t offset, uint64_t length, bool verify) const {
  uint32_t crc = 0;
  const Template* found = find(file, offset, length, verify, crc);
  if (!found) return std::nullopt;
  const Template& tp = *found;
  auto st = Storage::mapped(tp.dtype, tp.numel, file, offset + tp.data.data);
  st->key = tp.key;
  st->location = tp.location;
  Found f;
  f.tensor = Tensor(std::move(st), tp.storage_offset, tp.shape, tp.strides);
  f.tensor.is_parameter = tp.is_parameter;
  f.tensor.requires_grad = tp.requires_grad;
  f.crc = crc;
  f.record = tp.record;
  return f;
}

std::optional<TensorZipReader::Placed> TensorZipReader::match_place(const std::shared_ptr<const MappedFile>& file,
                                                                    uint64_t offset, uint64_t length, bool verify,
                                                                    DType dtype, std::span<const int64_t> shape) const {
  uint32_t crc = 0;
  const Template* found = find(file, offset, length, verify, crc);
  if (!found) return std::nullopt;
  const Template& tp = *found;
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (tp.dtype != dtype || !std::equal(tp.shape.begin(), tp.shape.end(), shape.begin(), shape.end()) || numel == 0 ||
      tp.storage_offset != 0 || tp.numel != numel || tp.data.size != static_cast<uint64_t>(numel) * dtype_size(dtype) ||
      tp.strides.size() != tp.shape.size())
    return std::nullopt;
  for (int64_t d = static_cast<int64_t>(tp.shape.size()) - 1, stride = 1; d >= 0; stride *= tp.shape[d--])
    if (tp.shape[d] != 1 && tp.strides[d] != stride) return std::nullopt;  // as Tensor::is_contiguous
  return Placed{offset + tp.data.data, tp.data.size, crc, tp.record};
}

void TensorZipReader::remember(std::span<const uint8_t> zip, const Tensor& t,
                               const std::map<std::string, ZipRecord>& records, const std::string& data,
                               bool verified) {
  const std::shared_ptr<Storage>& st = t.storage();
  const auto rec = records.find(data);
  if (zip.size() > kMaxBytes || rec == records.end() || !st || !st->is_mapped() || st->nbytes() != rec->second.size ||
      st->mapped_file()->data() + st->mapped_offset() != zip.data() + rec->second.data_offset)
    return;
  if (kept_ + zip.size() > kMaxKept) return;
  auto tp = std::make_shared<Template>();
  // A record's bytes and the places of its CRC-32: where store_zip_crc would write it (its central entry, and its
  // data descriptor or local header), each holding it.
  auto hole_of = [&](const ZipRecord& r) -> std::optional<Template::Hole> {
    if (r.data_offset + r.size > zip.size() || r.local_header + 8 > r.data_offset) return std::nullopt;
    Template::Hole h{r.data_offset, r.size, {}};
    bool inside = true;
    store_zip_crc(
        zip.size(), r, r.crc32, [&](uint64_t at, size_t n, uint8_t* out) { std::memcpy(out, zip.data() + at, n); },
        [&](uint64_t at, uint32_t) {
          inside = inside && at + 4 <= zip.size() && le32(zip.data() + at) == r.crc32;
          h.crcs.push_back(at);
        });
    if (!inside || h.crcs.empty()) return std::nullopt;
    return h;
  };
  std::vector<std::pair<uint64_t, uint64_t>> masked;
  auto mask = [&masked](const Template::Hole& h) {
    masked.emplace_back(h.data, h.data + h.size);
    for (uint64_t at : h.crcs) masked.emplace_back(at, at + 4);
  };
  const auto d = hole_of(rec->second);
  if (!d) return;
  tp->data = *d;
  mask(*d);
  for (const auto& [name, r] : records) {
    const std::string id = "/.data/serialization_id";
    if (name.size() < id.size() || name.compare(name.size() - id.size(), id.size(), id) != 0) continue;
    tp->id = hole_of(r);
    if (!tp->id) return;
    mask(*tp->id);
  }
  std::sort(masked.begin(), masked.end());
  uint64_t at = 0;
  for (const auto& [from, to] : masked) {
    if (from < at) return;  // overlapping: not a zip this takes
    if (from > at) tp->same.emplace_back(at, from);
    at = to;
  }
  if (at < zip.size()) tp->same.emplace_back(at, zip.size());
  tp->zip.assign(reinterpret_cast<const char*>(zip.data()), zip.size());
  tp->dtype = st->dtype();
  tp->numel = st->numel();
  tp->storage_offset = t.storage_offset();
  tp->shape = t.shape();
  tp->strides = t.strides();
  tp->is_parameter = t.is_parameter;
  tp->requires_grad = t.requires_grad;
  tp->verified = verified;
  tp->key = st->key;
  tp->location = st->location;
  tp->record = data;
  auto& same_length = templates_[zip.size()];
  if (same_length.size() == kPerLength) kept_ -= same_length.back()->zip.size(), same_length.pop_back();
  kept_ += tp->zip.size();
  same_length.insert(same_length.begin(), std::move(tp));
}

std::vector<std::shared_ptr<Storage>> generated_storages(const pickle::ValuePtr& root) {
  std::vector<std::shared_ptr<Storage>> order, generated;
  pickle_root(root, order);
  for (auto& s : order)
    if (s->is_generated()) generated.push_back(std::move(s));
  return generated;
}

struct DeferredTorchFile::Pieces {
  std::mutex mu;
  struct Piece {
    uint64_t offset, size;
    uint32_t crc;
  };
  std::vector<Piece> list;
};

DeferredTorchFile::DeferredTorchFile(const std::string& path, const pickle::ValuePtr& root,
                                     const TorchSaveOptions& options)
    : path_(path), zip_(std::make_unique<ZipWriter>(path, options.durable, options.start_writeback)) {
  std::vector<std::shared_ptr<Storage>> order;
  const std::string pkl = pickle_root(root, order);
  write_records(*zip_, options.archive_prefix, pkl, order, [&](const std::string& name, const std::shared_ptr<Storage>& st) {
    Record r;
    r.storage = st;
    r.zip_index = zip_->reserve(name, st->nbytes());
    records_.push_back(std::move(r));
    pieces_.push_back(std::make_unique<Pieces>());
  });
  zip_->flush();
}

DeferredTorchFile::~DeferredTorchFile() = default;

void DeferredTorchFile::write(size_t k, uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  // Piece by piece, each checksummed then written while it is in the CPU cache: the kernel copies out
  // of a cache-warm buffer far faster than out of a large cold one (bench_torch_dist.sh).
  constexpr size_t kPiece = 1u << 20;
  uint32_t crc = 0;
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    const auto piece = bytes.subspan(at, std::min(kPiece, bytes.size() - at));
    crc = crc32_update(crc, piece);
    zip_->write_reserved(records_.at(k).zip_index, offset + at, piece);
  }
  std::lock_guard lock(pieces_[k]->mu);
  pieces_[k]->list.push_back({offset, bytes.size(), crc});
}

uint64_t DeferredTorchFile::finish() {
  for (size_t k = 0; k < records_.size(); ++k) {
    auto& list = pieces_[k]->list;
    std::sort(list.begin(), list.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
    uint32_t crc = 0;
    uint64_t at = 0;
    for (const auto& p : list) {
      if (p.offset != at)
        fail(path_, "internal error: record " + std::to_string(k) + " written " +
                        (p.offset < at ? "twice" : "with a gap") + " at byte " + std::to_string(std::min(p.offset, at)));
      crc = at == 0 ? p.crc : crc32_combine(crc, p.crc, p.size);
      at += p.size;
    }
    const uint64_t want = records_[k].storage->nbytes();
    if (at != want)
      fail(path_, "internal error: record " + std::to_string(k) + " has " + std::to_string(at) + " of " +
                      std::to_string(want) + " bytes");
    zip_->set_crc(records_[k].zip_index, crc);
  }
  zip_->finish();
  std::error_code ec;
  const auto n = std::filesystem::file_size(path_, ec);
  return ec ? 0 : n;
}

}  // namespace ucpkit
