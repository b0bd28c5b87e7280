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
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "load/deepspeed_writer.h"
#include "load/model_info.h"
#include "load/universal_reader.h"

namespace ucpkit {
class DeferredTorchFile;
namespace ucp {
class MpiSession;
}
}  // namespace ucpkit

namespace ucpkit::load {

// Which rank reads which atomic tensor, in which batch: plain data, computed without I/O.
struct ExchangePlan {
  struct Read {
    int param = 0, state = 0;  // state: index into ModelInfo::states
    uint64_t bytes = 0;
    int owner = 0, batch = 0;
  };
  int ranks = 1;
  uint64_t batch_bytes = 0;
  std::vector<Read> reads;                   // batch by batch; model order inside a batch
  std::vector<std::vector<size_t>> batches;  // indices into reads
  nlohmann::json to_json(const ModelInfo& model) const;
};

// Atomic tensors in model order (parameter, then its states); a batch is closed once it holds at
// least `batch_bytes` (so one tensor larger than that is a batch of its own). Inside a batch the
// tensors go largest first to the rank with the fewest bytes in that batch (ties: fewest bytes so
// far, then lowest rank).
ExchangePlan plan_exchange(const ModelInfo& model, int ranks, uint64_t batch_bytes);

// Atomic element intervals [start, start + count) per (param, state), sorted and merged.
using AtomicNeeds = std::map<std::pair<int, int>, std::vector<std::pair<int64_t, int64_t>>>;
// The atomic elements the recorded `sources` of a storage of `dtype` read, added to `needs`
// (call normalize_needs once all are added).
void add_needs(const ModelInfo& model, const std::vector<DeepSpeedWriter::Source>& sources, DType dtype,
               AtomicNeeds& needs);
void normalize_needs(AtomicNeeds& needs);

// Where one rank's time went (wall seconds of each phase, summed over batches).
struct ExchangeStats {
  uint64_t bytes_written = 0;
  double read_seconds = 0, pack_seconds = 0, alltoall_seconds = 0, fill_seconds = 0, finish_seconds = 0;
};

// Fills and finishes `files` (reserved by this rank through `writer`'s sink, with its sources
// recorded) by the exchange; collective over all ranks of `mpi`.
ExchangeStats run_exchange(std::vector<std::unique_ptr<DeferredTorchFile>>& files, const DeepSpeedWriter& writer,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           ucp::MpiSession& mpi, int threads);

}  // namespace ucpkit::load
