// DCP `.metadata` -> Metadata. Every DCP class is a dataclass pickled as NEWOBJ(cls) + BUILD(__dict__),
// except TensorProperties, whose __getstate__ gives a tuple whose item 0 is the dtype (both eras;
// docs/formats-dcp.md). Fields are read by name; unknown extra attributes (Megatron's
// all_local_plans, newer torch fields) are ignored, unknown classes where a DCP class belongs are not.
#include "formats/dcp/metadata.h"

#include "formats/dcp/metadata_direct.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/pickle/unpickler.h"

namespace ucpkit::formats::dcp {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

constexpr std::string_view kPrototype = kPrototypePrefix;
constexpr std::string_view kCurrent = kCurrentPrefix;
constexpr std::string_view kShardedProps = kShardedPropsClass;

struct Parser {
  const std::string& name;
  ClassEra era = ClassEra::Current;
  std::string_view prefix = kCurrent;  // of this file's DCP classes (its Metadata's)

  [[noreturn]] void bad(const std::string& what) const { fail(name, "DCP metadata: " + what); }

  // The object's class, which must be `module_leaf` ("metadata.Metadata") of this file's era.
  void expect(const ValuePtr& v, std::string_view module_leaf, const std::string& where) const {
    const std::string want = std::string(prefix) + std::string(module_leaf);
    if (!v || v->kind != Kind::Object) bad(where + ": expected " + want + ", found " + (v ? v->repr(1) : "nothing"));
    if (v->class_path() != want) bad(where + ": unknown class " + v->class_path() + " (expected " + want + ")");
  }
  ValuePtr field(const ValuePtr& obj, std::string_view f, const std::string& where) const {
    ValuePtr v = obj->attr(f);
    if (!v) bad(where + ": no field '" + std::string(f) + "'");
    return v;
  }
  std::vector<int64_t> shape(const ValuePtr& v, const std::string& where) const {
    if (!v || (v->kind != Kind::Shape && !v->is_sequence())) bad(where + ": expected a torch.Size");
    std::vector<int64_t> s = v->as_shape();
    for (int64_t d : s)
      if (d < 0) bad(where + ": negative size or offset " + std::to_string(d));
    return s;
  }
  uint64_t count(const ValuePtr& v, const std::string& where) const {
    if (!v || (v->kind != Kind::Int && v->kind != Kind::BigInt)) bad(where + ": expected an int");
    const int64_t i = v->as_int();
    if (i < 0) bad(where + ": negative " + std::to_string(i));
    return static_cast<uint64_t>(i);
  }
  std::string text(const ValuePtr& v, const std::string& where) const {
    if (!v || v->kind != Kind::Str) bad(where + ": expected a str");
    return v->s;
  }

  DType properties_dtype(const ValuePtr& p, const std::string& where);
  Entry entry(const std::string& fqn, const ValuePtr& v);
  Item item(const ValuePtr& key, const ValuePtr& info);
  void storage_meta(const ValuePtr& v, Metadata& md) const;
  void planner_data(const ValuePtr& v, Metadata& md) const;
};

DType Parser::properties_dtype(const ValuePtr& p, const std::string& where) {
  const std::string cls = p && p->kind == Kind::Object ? p->class_path() : "";
  if (cls == kShardedProps) {
    if (era == ClassEra::Current) era = ClassEra::ShardedProps;
  } else if (cls != std::string(prefix) + "metadata.TensorProperties") {
    bad(where + ": unknown class " + (cls.empty() ? (p ? p->repr(1) : "nothing") : cls) +
        " (expected TensorProperties)");
  }
  // (dtype, layout, requires_grad, memory-format encoding, pin_memory[, later fields...])
  const ValuePtr& st = p->object->state;
  if (st && st->kind == Kind::Tuple && !st->items.empty() && st->items[0]->kind == Kind::Global &&
      st->items[0]->s == "torch")  // float8, complex, uint16...: a dtype io/dtype.h does not have
    bad(where + ": dtype torch." + st->items[0]->name + " is not supported");
  if (!st || st->kind != Kind::Tuple || st->items.empty() || st->items[0]->kind != Kind::Dtype)
    bad(where + ": TensorProperties state is not a tuple starting with a torch dtype");
  return st->items[0]->dtype;
}

Entry Parser::entry(const std::string& fqn, const ValuePtr& v) {
  const std::string where = "state_dict_metadata['" + escaped_brief(fqn) + "']";
  Entry e;
  e.fqn = fqn;
  if (v && v->kind == Kind::Object && v->class_path() == std::string(prefix) + "metadata.BytesStorageMetadata") {
    e.is_bytes = true;
    return e;
  }
  expect(v, "metadata.TensorStorageMetadata", where);
  e.dtype = properties_dtype(field(v, "properties", where), where);
  e.size = shape(field(v, "size", where), where + ".size");
  ValuePtr chunks = field(v, "chunks", where);
  if (!chunks->is_sequence()) bad(where + ".chunks: expected a list");
  for (size_t k = 0; k < chunks->items.size(); ++k) {
    const std::string cw = where + ".chunks[" + std::to_string(k) + "]";
    expect(chunks->items[k], "metadata.ChunkStorageMetadata", cw);
    Chunk c{shape(field(chunks->items[k], "offsets", cw), cw + ".offsets"),
            shape(field(chunks->items[k], "sizes", cw), cw + ".sizes")};
    if (c.offsets.size() != e.size.size() || c.sizes.size() != e.size.size())
      bad(cw + ": " + std::to_string(c.offsets.size()) + "-d offsets / " + std::to_string(c.sizes.size()) +
          "-d sizes for a " + std::to_string(e.size.size()) + "-d tensor");
    e.chunks.push_back(std::move(c));
  }
  return e;
}

Item Parser::item(const ValuePtr& key, const ValuePtr& info) {
  expect(key, "metadata.MetadataIndex", "storage_data key");
  Item it;
  it.fqn = text(field(key, "fqn", "MetadataIndex"), "MetadataIndex.fqn");
  const std::string where = "storage_data['" + escaped_brief(it.fqn) + "']";
  if (ValuePtr off = key->attr("offset"); off && !off->is_none()) it.offset = shape(off, where + " offset");
  expect(info, "filesystem._StorageInfo", where);
  it.storage.relative_path = text(field(info, "relative_path", where), where + ".relative_path");
  it.storage.offset = count(field(info, "offset", where), where + ".offset");
  it.storage.length = count(field(info, "length", where), where + ".length");
  if (ValuePtr t = info->attr("transform_descriptors"); t && !t->is_none()) {
    if (!t->is_sequence()) bad(where + ".transform_descriptors: expected a list");
    for (size_t k = 0; k < t->items.size(); ++k)
      it.storage.transform_descriptors.push_back(
          text(t->items[k], where + ".transform_descriptors[" + std::to_string(k) + "]"));
    it.storage.transforms = it.storage.transform_descriptors.size();
  }
  return it;
}

std::optional<std::string> opt_text(const ValuePtr& obj, std::string_view f) {
  ValuePtr v = obj->attr(f);
  if (!v || v->kind != Kind::Str) return std::nullopt;
  return v->s;
}

void Parser::storage_meta(const ValuePtr& v, Metadata& md) const {
  if (!v || v->is_none()) return;
  expect(v, "metadata.StorageMeta", "storage_meta");
  md.checkpoint_id = opt_text(v, "checkpoint_id");  // a PosixPath object when saved from a Path: left out
  md.save_id = opt_text(v, "save_id");
}

// planner_data: DefaultSavePlanner's paths, and the value as pickled when not all of it is of that shape.
void Parser::planner_data(const ValuePtr& v, Metadata& md) const {
  if (!v || v->is_none()) return;
  bool all = false;
  auto paths = std::make_shared<PlannerPaths>(PlannerPaths::of(*v, &all));
  if (all || paths->size()) md.planner = std::move(paths);
  if (!all) md.other_planner_data = v;
}

}  // namespace

std::string_view era_name(ClassEra era) {
  switch (era) {
    case ClassEra::Prototype: return "torch 1.13 (torch.distributed._shard.checkpoint)";
    case ClassEra::ShardedProps: return "torch 2.0-2.2 (TensorProperties under torch.distributed._shard)";
    case ClassEra::Current: return "torch >= 2.3";
    case ClassEra::Safetensors: return "safetensors flavour (no pickled classes)";
  }
  return "?";
}

Metadata parse_metadata(std::span<const uint8_t> bytes, const std::string& name) {
  if (std::optional<Metadata> md = parse_metadata_direct(bytes, name)) return std::move(*md);
  return parse_metadata_general(bytes, name);
}

Metadata parse_metadata_general(std::span<const uint8_t> bytes, const std::string& name) {
  // Entries and storage items are converted as the unpickler adds them to their dicts, and dropped
  // there: the pickle of 100,000 tensors built 1.9 GB of values when kept whole; a
  // placeholder takes each one's place, recognised by its address.
  Parser p{name};
  Metadata md;
  std::unordered_map<const pickle::Value*, size_t> converted_entry, converted_item;
  std::optional<std::string_view> conversion_prefix;
  pickle::UnpickleOptions options;
  options.on_dict_items = [&](std::vector<ValuePtr>& kv, std::vector<ValuePtr>& dropped) {
    for (size_t k = 0; k + 1 < kv.size(); k += 2) {
      ValuePtr& key = kv[k];
      ValuePtr& value = kv[k + 1];
      if (value->kind != Kind::Object || (key->kind != Kind::Str && key->kind != Kind::Object)) continue;
      const std::string cls = value->class_path();
      const std::string_view prefix = cls.rfind(kPrototype, 0) == 0 ? kPrototype : kCurrent;
      const std::string_view leaf = std::string_view(cls).substr(std::min(cls.size(), prefix.size()));
      const bool entry = key->kind == Kind::Str && (leaf == "metadata.TensorStorageMetadata" || leaf == "metadata.BytesStorageMetadata");
      const bool item = key->kind == Kind::Object && leaf == "filesystem._StorageInfo";
      if (!entry && !item) continue;
      if (conversion_prefix && *conversion_prefix != prefix) continue;  // mixed eras: the whole parse says so
      if (!conversion_prefix) conversion_prefix = p.prefix = prefix;
      // Distinct per item: an item's placeholder is its dict key, and equal keys would merge.
      ValuePtr mark = pickle::Value::integer(static_cast<int64_t>(entry ? md.entries.size() : md.items.size()));
      if (entry) {
        md.entries.push_back(p.entry(key->s, value));
        converted_entry.emplace(mark.get(), md.entries.size() - 1);
        dropped.push_back(std::exchange(value, mark));
      } else {
        md.items.push_back(p.item(key, value));
        converted_item.emplace(mark.get(), md.items.size() - 1);
        dropped.push_back(std::exchange(key, mark));
        dropped.push_back(std::exchange(value, pickle::Value::none()));
      }
    }
  };
  const ValuePtr root = pickle::unpickle(bytes, name, options);
  const std::string cls = root->kind == Kind::Object ? root->class_path() : std::string(kind_name(root->kind));
  if (cls == std::string(kPrototype) + "metadata.Metadata") {
    p.prefix = kPrototype;
    p.era = ClassEra::Prototype;
  } else if (cls == std::string(kCurrent) + "metadata.Metadata") {
    p.prefix = kCurrent;
  } else {
    p.bad("unknown class " + cls + " at the top (expected torch.distributed.checkpoint.metadata.Metadata)");
  }
  if (conversion_prefix && *conversion_prefix != p.prefix)
    p.bad("its entries' classes are of another torch era than its Metadata (" + std::string(*conversion_prefix) + ")");
  md.path = name;
  std::vector<Entry> entries;
  std::vector<Item> items;
  const ValuePtr sdm = p.field(root, "state_dict_metadata", "Metadata");
  if (sdm->kind != Kind::Dict) p.bad("state_dict_metadata is not a dict");
  for (const auto& [k, v] : sdm->entries) {
    const auto it = converted_entry.find(v.get());
    entries.push_back(it != converted_entry.end() ? std::move(md.entries[it->second])
                                                  : p.entry(p.text(k, "state_dict_metadata key"), v));
  }
  // A dict keyed by MetadataIndex objects (the unpickler keys objects by identity).
  const ValuePtr sd = p.field(root, "storage_data", "Metadata");
  if (sd->kind != Kind::Dict) p.bad("storage_data is not a dict (a storage writer other than FileSystemWriter's?)");
  for (const auto& [k, v] : sd->entries) {
    const auto it = converted_item.find(k.get());
    items.push_back(it != converted_item.end() ? std::move(md.items[it->second]) : p.item(k, v));
  }
  md.entries = std::move(entries);
  md.items = std::move(items);
  p.planner_data(root->attr("planner_data"), md);
  p.storage_meta(root->attr("storage_meta"), md);
  md.version = opt_text(root, "version");
  md.era = p.era;
  index_metadata(md);
  return md;
}

void index_metadata(Metadata& md) {
  index_entries(md);
  index_items(md);
}

void index_entries(Metadata& md) {
  if (md.entries.size() >= Metadata::kNoItem) fail(md.path, "DCP metadata: more than 2^32 entries");
  auto entry_name = [&md](uint32_t k) -> std::string_view { return md.entries[k].fqn; };
  md.entry_names = NameTable();
  md.entry_names.reserve(md.entries.size());
  for (size_t k = 0; k < md.entries.size(); ++k)
    if (md.entry_names.add(md.entries[k].fqn, static_cast<uint32_t>(k), entry_name))
      fail(md.path, "DCP metadata: state_dict_metadata lists '" + escaped_brief(md.entries[k].fqn) + "' twice");
}

void index_items(Metadata& md) {
  if (md.items.size() >= Metadata::kNoItem) fail(md.path, "DCP metadata: more than 2^32 items");
  auto item_name = [&md](uint32_t k) -> std::string_view { return md.items[k].fqn; };
  md.item_names = NameTable();
  md.item_names.reserve(md.items.size());
  md.item_next.assign(md.items.size(), Metadata::kNoItem);
  std::vector<uint32_t> last(md.items.size());  // per first item of a fqn: its last one so far
  for (size_t k = 0; k < md.items.size(); ++k) {
    const auto kk = static_cast<uint32_t>(k);
    if (const auto first = md.item_names.add(md.items[k].fqn, kk, item_name)) {
      md.item_next[last[*first]] = kk;
      last[*first] = kk;
    } else {
      last[k] = kk;
    }
  }
}

Metadata read_metadata(const std::string& path) {
  auto file = MappedFile::open(path);
  return parse_metadata(file->bytes(), path);
}

namespace {

// Where this thread last found an entry and an item, of whichever Metadata: a reader walks a checkpoint in file order,
// so the next one asked for is mostly the one after, checked by its fqn (and offsets) before the hash maps are asked
// (10^5 lookups of long fqns were a third of a 100,000-tensor reshard's read-ahead thread, mostly cache misses).
thread_local size_t last_entry = SIZE_MAX - 1, last_item = SIZE_MAX - 1;

bool item_matches(const Item& it, const std::string& fqn, const std::vector<int64_t>* offsets) {
  return it.fqn == fqn && (offsets ? it.offset && *it.offset == *offsets : !it.offset);
}

}  // namespace

const Entry* Metadata::find(const std::string& fqn) const {
  if (const size_t next = last_entry + 1; next < entries.size() && entries[next].fqn == fqn) {
    last_entry = next;
    return &entries[next];
  }
  const auto at = entry_names.find(fqn, [this](uint32_t k) -> std::string_view { return entries[k].fqn; });
  if (!at) return nullptr;
  last_entry = *at;
  return &entries[*at];
}

Entry& Metadata::add_entry(Entry e) {
  if (entries.size() >= kNoItem) fail(path, "DCP metadata: more than 2^32 entries");
  entries.push_back(std::move(e));
  entry_names.add(entries.back().fqn, static_cast<uint32_t>(entries.size() - 1),
                  [this](uint32_t k) -> std::string_view { return entries[k].fqn; });
  return entries.back();
}

std::vector<size_t> Metadata::items_of(const std::string& fqn) const {
  std::vector<size_t> out;
  const auto first = item_names.find(fqn, [this](uint32_t k) -> std::string_view { return items[k].fqn; });
  for (uint32_t k = first ? *first : kNoItem; k != kNoItem && k < item_next.size(); k = item_next[k]) out.push_back(k);
  return out;
}

const Item& Metadata::item_of(const std::string& fqn, const std::vector<int64_t>* offsets) const {
  if (const size_t next = last_item + 1; next < items.size() && item_matches(items[next], fqn, offsets)) {
    last_item = next;
    return items[next];
  }
  const auto first = item_names.find(fqn, [this](uint32_t k) -> std::string_view { return items[k].fqn; });
  for (uint32_t k = first ? *first : kNoItem; k != kNoItem && k < item_next.size(); k = item_next[k])
    if (item_matches(items[k], fqn, offsets)) {
      last_item = k;
      return items[k];
    }
  std::string at;
  if (offsets) {
    at = " at offsets [";
    for (size_t k = 0; k < offsets->size(); ++k) at += (k ? ", " : "") + std::to_string((*offsets)[k]);
    at += "]";
  }
  fail(path, "DCP metadata: no storage_data item for '" + escaped_brief(fqn) + "'" + at);
}

}  // namespace ucpkit::formats::dcp
