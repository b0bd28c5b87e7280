// Writes a DCP checkpoint folder as torch 2.6's FileSystemWriter does (single_file_per_rank): one
// data file `__{rank}_0.distcp` per rank of the plan (formats/dcp/save_plan.h) concatenating its items
// with no header (each tensor item a complete torch.save zip of one chunk, each bytes item the
// torch.save(obj) bytes it is given), and `.metadata`, one pickle of torch 2.x's
// torch.distributed.checkpoint.metadata.Metadata with the classes and state torch 2.6 writes.
// The folder is written into a staging folder beside `out` and renamed into place after the flush;
// on any error nothing is left. One chunk is in memory at a time (plus the one whole tensor that
// chunks_of_whole keeps while it cuts that tensor's chunks); every rank's data file is open at once
// (one descriptor per rank of the plan, no buffer while another file is written).
//
// Use (ucp-load --format dcp): plan = make_save_plan(entries, target);
// write_dcp(plan, chunks_of_whole(whole_tensor_fn, bytes_fn), out, options).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/dcp/metadata.h"
#include "formats/dcp/save_plan.h"
#include "io/pickle/pickler.h"
#include "io/pickle/value.h"
#include "io/tensor.h"

namespace ucpkit::formats::dcp {

// Where the data comes from. Called in plan order: entries in order, each tensor's chunks in order.
struct ChunkSource {
  // Chunk `chunk` of tensor entry `e`: a tensor of e.dtype and e.chunks[chunk].sizes (any strides).
  std::function<Tensor(const Entry& e, size_t chunk)> chunk;
  // The stored bytes of bytes entry `e`: torch.save(obj) of the non-tensor value.
  std::function<std::vector<uint8_t>(const Entry& e)> bytes;
};

// A source of whole tensors: each chunk cut out of `whole(e)`, which is called once per tensor (the
// last one is kept while its chunks are cut; the writer asks with the plan's own entries, told apart by address).
ChunkSource chunks_of_whole(std::function<Tensor(const Entry&)> whole,
                            std::function<std::vector<uint8_t>(const Entry&)> bytes);

// The box `c` of `whole` as a contiguous tensor owning its storage: a copy, unless the box is all of a
// tensor that already owns its storage.
Tensor cut_box(const Tensor& whole, const Chunk& c);

struct WriteOptions {
  bool overwrite = false;  // replace an existing `out`
  bool durable = true;     // flush the file system before the rename (tools' --no-sync: false)
  // Metadata.planner_data: DefaultSavePlanner's paths (planner), else a value as pickled (other_planner_data: a custom
  // planner's); neither: {fqn: (fqn,)} for every entry (a flat state dict). Pass the source's to keep its nesting.
  std::shared_ptr<const PlannerPaths> planner;
  pickle::ValuePtr other_planner_data;
  std::string save_id;  // StorageMeta.save_id; empty: None
  // StorageMeta.checkpoint_id; empty: `out` made absolute (give the final folder when `out` is staged)
  std::string checkpoint_id;
};

// What a write did, item by item in write order: where each went and its place in the plan, which names it (a fqn
// copied per item was a tenth of the writing thread on 100,000 tensors).
struct WriteResult {
  std::vector<StorageInfo> storage;              // per item: file, offset, length
  std::vector<std::pair<size_t, size_t>> order;  // per item: (plan entry, chunk; PlannedItem::kBytes for bytes)
  uint64_t bytes = 0;                            // data bytes written (all data files)
};

// Writes `plan` with data from `source` into the folder `out`. Throws Error (naming the file or the
// entry) when a chunk from the source has another dtype or shape than planned, when a tensor's
// chunks do not tile it, or on an I/O failure; `out` is then untouched.
WriteResult write_dcp(const SavePlan& plan, const ChunkSource& source, const std::string& out,
                      const WriteOptions& options = {});

// write_dcp's two halves, for a plan written by several processes into one folder (ucp-load --format torch_dist
// under mpirun): the data files marked in `mine` (one flag per plan file) written into the existing folder `dir`,
// the source called for their items only, in plan order (Errors name `out`); then, by one process, `.metadata` from
// every process's items (WriteResults joined: items and order appended) in plan order. write_dcp is both in a
// staging folder of its own.
// `written`, when given, sees each item as it is written (in write order): its place in the plan and where it went.
WriteResult write_dcp_files(const SavePlan& plan, const ChunkSource& source, const std::string& dir,
                            const std::vector<char>& mine, const std::string& out,
                            const std::function<void(const PlannedItem&, const StorageInfo&)>& written = {});
class MetadataPickle;
void write_dcp_metadata(const SavePlan& plan, const WriteResult& written, const std::string& dir, const std::string& out,
                        const WriteOptions& options, MetadataPickle* head = nullptr);

// The `.metadata` bytes for `plan` in steps: the constructor pickles what the plan alone gives (Metadata, its
// state_dict_metadata and planner_data), add() each item where it was written (these may run on another thread
// while the data files are written), finish() the rest. `options` must outlive it.
class MetadataPickle {
 public:
  MetadataPickle(const SavePlan& plan, const WriteOptions& options);
  ~MetadataPickle();
  MetadataPickle(const MetadataPickle&) = delete;
  MetadataPickle& operator=(const MetadataPickle&) = delete;
  // The items in plan order, one at a time, then the rest; finish once. add: the item of the plan's entry
  // `at.entry`, chunk `at.chunk` (PlannedItem::kBytes: its bytes item), stored as `storage`.
  void add(const PlannedItem& at, const StorageInfo& storage);
  // The bytes pickled so far (a view until the next add or finish): the front of what finish() returns.
  std::string_view so_far();
  std::string finish(const std::string& checkpoint_id);

 private:
  struct State;
  const WriteOptions& options_;
  std::unique_ptr<State> s_;
};

// The `.metadata` bytes for `plan` whose items were written as `written` says (by write_dcp / write_dcp_files; added
// by their places in the plan, WriteResult::order): torch 2.6's classes, a pickle Python's pickle.load and our reader
// read.
std::string metadata_pickle(const SavePlan& plan, const WriteResult& written, const WriteOptions& options,
                            const std::string& checkpoint_id);

}  // namespace ucpkit::formats::dcp
