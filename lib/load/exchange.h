// ucp-load's redundancy-bypassing execution (the paper's section 5, on CPU with MPI): every atomic
// tensor is read by exactly one rank, its owner (owners balanced by bytes; the checksum is verified
// in the same pass), in batches of parameters of bounded size; the elements each rank needs for the
// files it writes are exchanged with one MPI all-to-all per batch, and every rank writes its pieces
// of its own files out of order (DeferredTorchFile). Memory per rank is bounded by the batch, not
// by the model or the files.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"
#include "load/deepspeed_writer.h"
#include "load/model_info.h"
#include "load/universal_reader.h"
#include "core/reporter.h"

namespace ucpkit::parallel {
class MpiSession;
}

namespace ucpkit::load {

// Atomic element intervals [start, start + count) per (param, state), sorted and merged.
using AtomicNeeds = std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>>;
// The atomic elements the recorded `sources` of a storage of `dtype` read, added to `needs`
// (call normalize_needs once all are added).
void add_needs(const ModelInfo& model, const std::vector<DeepSpeedWriter::Source>& sources, DType dtype,
               AtomicNeeds& needs);
void normalize_needs(AtomicNeeds& needs);

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
ExchangePlan plan_exchange(const ModelInfo& model, const std::vector<FileNeeds>& files, int ranks,
                           uint64_t batch_bytes);

// A target file laid out (pickled root; its generated storages are filled later) but not created.
struct LaidOutFile {
  std::string path;
  pickle::ValuePtr root;
};

// What each target file needs of each atomic tensor (its generated storages' recorded sources).
std::vector<FileNeeds> file_needs(const std::vector<LaidOutFile>& files, const DeepSpeedWriter& writer,
                                  const ModelInfo& model, int threads);

// Where one rank's time went (wall seconds of each phase, summed over batches).
struct ExchangeStats {
  uint64_t bytes_written = 0, files_written = 0;
  // Sum over fill steps of the bytes of the busiest rank, and the same if every step were split
  // evenly (their ratio is how long ranks wait for each other in the fill).
  uint64_t fill_cost = 0, fill_cost_even = 0;
  double read_seconds = 0, pack_seconds = 0, alltoall_seconds = 0, fill_seconds = 0, finish_seconds = 0;
};

// Writes the target files by the exchange; collective over all ranks of `mpi`. `files`: every
// target file, in the same order on every rank, laid out through `writer` with its sources recorded;
// `plan` made from them; this rank creates and writes the files the plan gives it.
ExchangeStats run_exchange(const std::vector<LaidOutFile>& files, const DeepSpeedWriter& writer,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           parallel::MpiSession& mpi, int threads, const Reporter& reporter = {});

}  // namespace ucpkit::load
