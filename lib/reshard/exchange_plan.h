// The plan of ucp-load's redundancy-bypassing exchange (exchange.h runs it): which atomic elements
// each target file needs, which rank writes which file, how every atomic tensor is cut into units,
// which rank reads each unit and in which batch. Plain data, built without I/O and without MPI
// (every rank computes the same plan from the same laid-out files).
#pragma once
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"
#include "reshard/laid_out_file.h"
#include "reshard/model_info.h"

namespace ucpkit::reshard {

// Atomic element intervals [start, start + count) per (param, state), sorted and merged.
using AtomicNeeds = std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>>;
// The atomic elements the recorded `sources` of a storage of `dtype` read, added to `needs`
// (call normalize_needs once all are added).
void add_needs(const ModelInfo& model, const std::vector<StorageSource>& sources, DType dtype,
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

// What this rank does with the plan, also plain data without I/O (exchange.cpp builds it from the
// files this rank creates and every rank's needs, then executes it batch by batch).

// Calls f(start, count) for the parts of the sorted, merged intervals `v` inside [a, b).
template <class F>
void for_each_overlap(const std::vector<std::pair<int64_t, int64_t>>& v, int64_t a, int64_t b, F&& f) {
  auto it = std::upper_bound(v.begin(), v.end(), a, [](int64_t x, const auto& iv) { return x < iv.first; });
  if (it != v.begin()) --it;
  for (; it != v.end() && it->first < b; ++it) {
    const int64_t lo = std::max(a, it->first), hi = std::min(b, it->first + it->second);
    if (lo < hi) f(lo, hi - lo);
  }
}

// Calls f(start, count) for the elements of unit `unit` that `needs` holds (in increasing order).
template <class F>
void for_each_needed(const AtomicNeeds& needs, const ExchangePlan::Read& unit, F&& f) {
  auto it = needs.find({unit.param, unit.state});
  if (it != needs.end()) for_each_overlap(it->second, unit.start, unit.start + unit.count, f);
}
uint64_t needed_count(const AtomicNeeds& needs, const ExchangePlan::Read& unit);

// One piece of a generated storage to fill: bytes [begin, end), written in fill step `step`
// (0: before the first batch; b + 1: once batch b has been exchanged).
struct FillPiece {
  size_t step = 0;
  uint64_t begin = 0, end = 0;
};
// The pieces of a generated storage of `nbytes` bytes, elements of `element_size` bytes, made of
// `sources` (sorted by byte_begin, LaidOutFile::sources_of): the sources' byte ranges cut
// where their atomic elements move to a unit of another batch, each in the fill step of that batch,
// and the gaps between sources (zeros, step 0). Padding rows inside a source go with the piece
// they follow (step 0 when a source starts with them). In byte order; together they cover
// [0, nbytes) once.
std::vector<FillPiece> fill_pieces(const std::vector<StorageSource>& sources, uint64_t element_size,
                                   uint64_t nbytes, const ModelInfo& model, const ExchangePlan& plan);

// Per fill step, the bytes each rank writes (`step_bytes[rank][step]`, every rank the same number of
// steps): the sums over steps of the busiest rank's bytes and of an even split (rounded up), the
// ExchangeStats::fill_cost and fill_cost_even.
std::pair<uint64_t, uint64_t> fill_costs(const std::vector<std::vector<int64_t>>& step_bytes);

// A rank's needs as (param, state, start, count) quadruples for an MPI all-gather, and back.
std::vector<int64_t> flatten_needs(const AtomicNeeds& needs);
AtomicNeeds unflatten_needs(const std::vector<int64_t>& flat);

// One rank's part of every batch, from the plan and what every rank needs (`needs[rank]`).
struct RankBatches {
  struct Batch {
    std::vector<size_t> owned;                       // the units this rank reads (indices into plan.reads)
    std::vector<uint64_t> owned_at;                  // float offset of each in the read buffer (+ end)
    std::vector<uint64_t> send_counts, recv_counts;  // floats to and from each rank (none to itself)
  };
  std::vector<Batch> batches;                      // one per plan batch
  uint64_t max_owned = 0, max_send = 0, max_recv = 0;  // floats: the largest batch's buffers
};
RankBatches plan_rank_batches(const ExchangePlan& plan, const std::vector<AtomicNeeds>& needs, int rank);

// What each target file needs of each atomic tensor (its generated storages' sources).
std::vector<FileNeeds> file_needs(const std::vector<LaidOutFile>& files, const ModelInfo& model, int threads);

}  // namespace ucpkit::reshard
