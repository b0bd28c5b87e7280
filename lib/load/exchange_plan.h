// The plan of ucp-load's redundancy-bypassing exchange (exchange.h runs it): which atomic elements
// each target file needs, which rank writes which file, how every atomic tensor is cut into units,
// which rank reads each unit and in which batch. Plain data, built without I/O and without MPI
// (every rank computes the same plan from the same laid-out files).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"
#include "load/deepspeed_writer.h"
#include "load/model_info.h"

namespace ucpkit::load {

// Atomic element intervals [start, start + count) per (param, state), sorted and merged.
using AtomicNeeds = std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>>;
// The atomic elements the recorded `sources` of a storage of `dtype` read, added to `needs`
// (call normalize_needs once all are added).
void add_needs(const ModelInfo& model, const std::vector<DeepSpeedWriter::Source>& sources, DType dtype,
               AtomicNeeds& needs);
void normalize_needs(AtomicNeeds& needs);

// Atomic tensors are numbered param * states + state (ExchangePlan::first_unit's index).
inline size_t tensor_index(const ModelInfo& model, int param, int state) {
  return static_cast<size_t>(param) * model.states.size() + static_cast<size_t>(state);
}

// Which rank reads which piece of which atomic tensor, in which batch: plain data, no I/O.
struct ExchangePlan {
  // A unit: atomic elements [start, start + count) of one tensor, read by `owner` in `batch`.
  struct Read {
    int param = 0, state = 0;  // state: index into ModelInfo::states
    int64_t start = 0, count = 0;
    uint64_t bytes = 0;
    int owner = 0, batch = 0;
  };
  int ranks = 1;
  uint64_t batch_bytes = 0;
  int64_t unit_elements = 1;                 // every tensor is cut into units of this many elements
  std::vector<Read> reads;                   // units in model order: tensor, then start
  std::vector<size_t> first_unit;            // per tensor [param * states + state]: its first unit (+ end)
  std::vector<std::vector<size_t>> batches;  // indices into reads, model order inside a batch
  std::vector<int> file_ranks;               // which rank writes each target file
  nlohmann::json to_json(const ModelInfo& model) const;
};

// What one target file needs: the atomic elements of each tensor, and its bytes in the file.
struct FileNeeds {
  AtomicNeeds elements;  // normalized
  uint64_t bytes = 0;
};

// The plan, from what every target file needs (`files`, the same list on every rank):
// * each file is written by one rank, files balanced by bytes (largest first onto the least loaded;
//   files with no bytes to fill by count);
// * every tensor is cut into units of at most max(1, batch_bytes / 32) bytes (so a tensor larger
//   than a batch no longer makes a batch of its own, and a batch holds pieces of many files);
// * each unit is read by exactly one rank, one whose files need most of its elements (within 9/10 of
//   the most; among those the rank that has read the fewest bytes), so most of the data is used
//   where it is read and reads stay balanced when several ranks need a unit about equally;
// * batches: each unit joins the queue of the file that needs most of it (model order inside a
//   queue); the queues are merged by how far into its queue each unit lies (its middle as a fraction
//   of the queue's bytes), so every batch carries about the same share of every file and every rank
//   has its part of each batch to write (in model order, a batch fed one or two files and the other
//   ranks waited); a batch is closed once it holds at least `batch_bytes`.
// The steps below, in this order.
ExchangePlan plan_exchange(const ModelInfo& model, const std::vector<FileNeeds>& files, int ranks,
                           uint64_t batch_bytes);

// Step 1: every tensor (param * states + state, in that order) cut into units of
// `plan.unit_elements` (a tensor with no elements is one empty unit): fills plan.reads (owner and
// batch still 0) and plan.first_unit.
void cut_units(const ModelInfo& model, ExchangePlan& plan);

// Step 2: which rank writes each file: files with bytes by assign_by_size; files with nothing to
// fill (ZeRO-3 model files, PP > 1 model files) by count, onto the rank with the fewest files.
std::vector<int> assign_files(const std::vector<FileNeeds>& files, int ranks);

// Step 3: per unit, how many of its elements the files of each rank need, and its queue.
struct UnitNeeds {
  std::vector<std::vector<std::pair<int, uint64_t>>> by_rank;  // per unit: (rank, elements), sparse
  std::vector<long> queue;  // per unit: the file needing most of it (lowest on ties); -1: no file
};
UnitNeeds unit_needs(const ModelInfo& model, const std::vector<FileNeeds>& files, const ExchangePlan& plan);

// Step 4: the owner of every unit, in model order: among the ranks that need at least 9/10 as much
// of it as the rank needing most, the one that has read the fewest bytes so far, then the lowest
// (a unit nobody needs: the rank that has read least).
void choose_owners(const UnitNeeds& needs, ExchangePlan& plan);

// Step 5: the units in reading order: the queues merged by progress (the middle of each unit as a
// fraction of its queue's bytes; stable, so model order on ties).
std::vector<size_t> merge_queues(const std::vector<long>& queue, const ExchangePlan& plan);

// Step 6: the units taken in `order` into batches, each closed once it holds at least
// plan.batch_bytes (model order inside a batch): fills plan.batches and every unit's batch.
void cut_batches(const std::vector<size_t>& order, ExchangePlan& plan);

// A target file laid out (pickled root; its generated storages are filled later) but not created.
struct LaidOutFile {
  std::string path;
  pickle::ValuePtr root;
};

// What each target file needs of each atomic tensor (its generated storages' recorded sources).
std::vector<FileNeeds> file_needs(const std::vector<LaidOutFile>& files, const DeepSpeedWriter& writer,
                                  const ModelInfo& model, int threads);

}  // namespace ucpkit::load
