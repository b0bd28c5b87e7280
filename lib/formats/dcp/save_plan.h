// Where a DCP save puts each piece of a state dict: plain data, no I/O. For a list of entries (tensors
// with their fqn, dtype and global shape; bytes items) and a target mesh, the chunks torch's
// DefaultSavePlanner would write for DTensors of that layout (each rank's local box from
// torch/distributed/tensor/_utils.py compute_local_shape_and_global_offset, replicas deduplicated as
// checkpoint/_dedup_save_plans.py does), and which `__{rank}_0.distcp` holds each chunk, in write
// order. The byte offsets inside those files are known only once the items are written (each item is
// a torch.save zip): Writer (formats/dcp/writer.h) returns them.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/dcp/metadata.h"

namespace ucpkit::formats::dcp {

// One mesh dimension's placement of a tensor: Shard(dim), or Replicate when dim < 0.
struct Placement {
  int dim = -1;
  static Placement replicate() { return {}; }
  static Placement shard(int d) { return {d}; }
  bool operator==(const Placement&) const = default;
};

// The layouts a target mesh can have (as the torch2lab fixtures are saved):
//  * Whole: one rank, every tensor one whole chunk (dcp.save of plain tensors).
//  * Replicated: mesh [world], every rank holds every tensor whole (plain tensors saved from `world`
//    ranks): each tensor is written once, by the rank the replica balance picks.
//  * Rows: mesh [world], tensors of >= 1 dims Shard(0) (FSDP2's fully_shard), scalars replicated.
//  * Columns: mesh [world], tensors of >= 2 dims Shard(1), 1-D Shard(0), scalars replicated.
//  * Grid: mesh [world / cols, cols], 2-D and more (Shard(0), Shard(1)), 1-D (Shard(0), Replicate())
//    (torch2lab dcp_save.py --layout 2d), scalars replicated.
struct Target {
  enum class Kind { Whole, Replicated, Rows, Columns, Grid } kind = Kind::Whole;
  int64_t world = 1;  // ranks (Whole: 1)
  int64_t cols = 1;   // Grid: size of the second mesh dimension (divides world)

  static Target whole() { return {}; }
  static Target replicated(int64_t world) { return {Kind::Replicated, world, 1}; }
  static Target rows(int64_t world) { return {Kind::Rows, world, 1}; }
  static Target columns(int64_t world) { return {Kind::Columns, world, 1}; }
  static Target grid(int64_t world, int64_t cols) { return {Kind::Grid, world, cols}; }
};

// "whole", "replicated", "rows", "columns" or "grid" (for messages and JSON).
std::string_view target_kind_name(Target::Kind kind);

// The mesh shape of a target (ranks numbered row-major over it); throws UsageError for a bad target.
std::vector<int64_t> mesh_shape(const Target& target);
// The placements (one per mesh dimension) of a tensor of `ndim` dims under `target`.
std::vector<Placement> placements_for(const Target& target, size_t ndim);

// torch's compute_local_shape_and_global_offset (plain Shard / Replicate placements): the box of the
// global tensor `shape` held by the rank at `coordinate` of `mesh`.
Chunk local_box(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh,
                const std::vector<int64_t>& coordinate, const std::vector<Placement>& placements);

// One item of a data file: chunk `chunk` of entries[entry], or the bytes entry (chunk == kBytes).
struct PlannedItem {
  static constexpr size_t kBytes = static_cast<size_t>(-1);
  size_t entry = 0;
  size_t chunk = kBytes;
};

// One data file `__{rank}_0.distcp` and its items in write order (a rank with nothing has no file).
struct PlannedFile {
  int64_t rank = 0;
  std::string relative_path;
  std::vector<PlannedItem> items;
};

struct SavePlan {
  std::vector<int64_t> mesh;    // [1] for Whole
  std::vector<Entry> entries;   // state-dict order; each tensor's chunks in torch's global-plan order
  std::vector<PlannedFile> files;
  // The order the items are written in (each file's items follow it); empty: the entries in order, each one's chunks
  // in order. The .metadata lists the items in plan order either way. A writer whose source reads the same bytes
  // for several entries (a torch_dist import: a parameter's model copy and its fp32 master) puts those items
  // together, so the second read finds the bytes still in the page cache.
  std::vector<PlannedItem> write_order;
};

// The plan for `entries` (fqn, is_bytes, dtype, size; their chunks are ignored) on `target`. Every
// rank's plan lists its boxes in state-dict order; a box that several ranks hold (replicas, bytes
// items) goes to the rank that has planned the fewest bytes so far (the lowest on ties), as
// dedup_save_plans does; a tensor's chunks are listed rank by rank (the global plan's order).
// Throws UsageError on a bad target, Error on duplicate fqns or negative sizes. `fqns_unique`: the caller knows no fqn
// is listed twice (a read Metadata whose index holds each of its entries: index_entries refused a repeat), and the
// plan does not look again (a hash of each of 10^5 fqns on one core).
SavePlan make_save_plan(const std::vector<Entry>& entries, const Target& target, bool fqns_unique = false);

// The file name torch gives rank `rank`'s single data file.
std::string data_file_name(int64_t rank);

// The plan as JSON (mesh, entries with chunks, files with their items).
std::string plan_json(const SavePlan& plan);

}  // namespace ucpkit::formats::dcp
