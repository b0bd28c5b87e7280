// PyTorch Distributed Checkpoint (DCP) `.metadata`: one pickled torch.distributed.checkpoint
// Metadata, read through our pickle VM (every DCP class comes back as an opaque Object; its fields are
// read here) into plain structs. Both class-path eras are read: torch 1.13's prototype
// (torch.distributed._shard.checkpoint.*) and torch 2.x (torch.distributed.checkpoint.*), with
// TensorProperties under torch.distributed._shard.sharded_tensor.metadata before torch 2.3 and
// under torch.distributed.checkpoint.metadata since (docs/formats-dcp.md cites the sources).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/name_table.h"
#include "formats/dcp/planner_paths.h"
#include "io/pickle/value.h"

#include "io/dtype.h"

namespace ucpkit::formats::dcp {

// The class-path prefixes of the two eras, and TensorProperties' class of torch 2.0-2.2.
inline constexpr std::string_view kPrototypePrefix = "torch.distributed._shard.checkpoint.";
inline constexpr std::string_view kCurrentPrefix = "torch.distributed.checkpoint.";
inline constexpr std::string_view kShardedPropsClass = "torch.distributed._shard.sharded_tensor.metadata.TensorProperties";

// ChunkStorageMetadata: one stored piece of a tensor, a box of the global tensor.
struct Chunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// TensorStorageMetadata (BytesStorageMetadata when is_bytes).
struct Entry {
  std::string fqn;
  bool is_bytes = false;
  DType dtype = DType::Float32;   // TensorProperties.dtype (state tuple item 0)
  std::vector<int64_t> size;      // global shape
  std::vector<Chunk> chunks;      // as listed; their order is the MetadataIndex.index hint
};

// _StorageInfo: where an item's bytes are, [offset, offset + length) of relative_path.
struct StorageInfo {
  std::string relative_path;
  uint64_t offset = 0;
  uint64_t length = 0;
  size_t transforms = 0;  // transform_descriptors.size()
  // transform_descriptors (torch >= 2.7 FileSystemWriter _extensions, e.g. "stream.zstd/1"), in the
  // order the load side applies them (formats/dcp/transforms.h); empty when absent.
  std::vector<std::string> transform_descriptors;
  // The item is the chunk's raw little-endian bytes (a safetensors tensor of the HuggingFace flavour,
  // formats/dcp/safetensors_flavour.h), not a torch.save zip.
  bool raw = false;
};

// MetadataIndex -> _StorageInfo. A tensor item is keyed by its chunk's offsets, a bytes item by fqn.
struct Item {
  std::string fqn;
  std::optional<std::vector<int64_t>> offset;  // MetadataIndex.offset (None for bytes items)
  StorageInfo storage;
};

enum class ClassEra {
  Prototype,     // torch 1.13: torch.distributed._shard.checkpoint.*
  ShardedProps,  // torch 2.0-2.2: torch.distributed.checkpoint.*, TensorProperties under _shard
  Current,       // torch >= 2.3: TensorProperties in torch.distributed.checkpoint.metadata
  Safetensors,   // HuggingFaceStorageWriter's safetensors files: no pickled classes (safetensors_flavour.h)
};

struct Metadata {
  std::string path;              // the file read (named in every error)
  ClassEra era = ClassEra::Current;
  std::vector<Entry> entries;    // state_dict_metadata, in file order
  std::vector<Item> items;       // storage_data, in file order
  // planner_data of DefaultSavePlanner: flattened fqn -> the nested state-dict path it came from (planner_paths.h);
  // null when the file records none of that shape. Shared: a writer keeping the source's nesting writes it back.
  std::shared_ptr<const PlannerPaths> planner;
  // planner_data as pickled when not all of it is of that shape (a custom planner's; `planner` holds the entries that
  // are): what such a writer writes back instead. Null otherwise.
  pickle::ValuePtr other_planner_data;
  std::optional<std::string> checkpoint_id, save_id;  // storage_meta (torch >= 2.4), when present
  std::optional<std::string> version;                 // Metadata.version (newer torch), when present
  // fqn -> position in entries / the first of its items, each next one in item_next (index_metadata builds them;
  // lookups stay O(1) per chunk on checkpoints of 10^5 items, and cost no copy of a name).
  NameTable entry_names, item_names;
  std::vector<uint32_t> item_next;  // the next item of the same fqn; kNoItem: none
  static constexpr uint32_t kNoItem = UINT32_MAX;

  bool has_planner_data() const { return planner || other_planner_data; }
  // The entry of `fqn`, or nullptr.
  const Entry* find(const std::string& fqn) const;
  Entry* find(const std::string& fqn) { return const_cast<Entry*>(std::as_const(*this).find(fqn)); }
  // Appends `e` to entries, found at once by find() (an entry is found by its first fqn).
  Entry& add_entry(Entry e);
  // The positions in items of `fqn`'s items, in file order.
  std::vector<size_t> items_of(const std::string& fqn) const;
  // The item holding chunk `offsets` of `fqn` (bytes: offsets null); throws Error naming the file.
  const Item& item_of(const std::string& fqn, const std::vector<int64_t>* offsets) const;
};

// Parses `.metadata` bytes; `name` is the file named in every error. A DCP save's own shape is read in one
// pass (metadata_direct.h), anything else through the general unpickler (parse_metadata_general).
Metadata parse_metadata(std::span<const uint8_t> bytes, const std::string& name);
// The general unpickler's parse alone: every pickle, every error worded (tests compare the two).
Metadata parse_metadata_general(std::span<const uint8_t> bytes, const std::string& name);
// Reads and parses a `.metadata` file.
Metadata read_metadata(const std::string& path);
// Rebuilds md.entry_names / md.item_names / md.item_next from md.entries / md.items;
// a fqn listed twice is an Error naming md.path.
void index_metadata(Metadata& md);
// Its two halves, independent of each other: md.entry_names from md.entries; md.item_names and md.item_next from
// md.items.
void index_entries(Metadata& md);
void index_items(Metadata& md);

std::string_view era_name(ClassEra era);

}  // namespace ucpkit::formats::dcp
