// ucp-load's redundancy-bypassing execution (the paper's section 5, on CPU with MPI): every atomic
// tensor is read by exactly one rank, its owner (owners balanced by bytes; the checksum is verified
// in the same pass), in batches of parameters of bounded size; the elements each rank needs for the
// files it writes are exchanged with one MPI all-to-all per batch, and every rank writes its pieces
// of its own files out of order (DeferredTorchFile). Memory per rank is bounded by the batch, not
// by the model or the files. The plan (who writes which file, reads which unit in which batch, and
// each rank's part of every batch) is plain data in exchange_plan.h; run_exchange executes it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/reporter.h"
#include "reshard/exchange_plan.h"
#include "reshard/laid_out_file.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"

namespace ucpkit::parallel {
class MpiSession;
}

namespace ucpkit::reshard {

// Where one rank's time went (wall seconds of each phase, summed over batches).
struct ExchangeStats {
  uint64_t bytes_written = 0, files_written = 0;
  // Sum over fill steps of the bytes of the busiest rank, and the same if every step were split
  // evenly (their ratio is how long ranks wait for each other in the fill).
  uint64_t fill_cost = 0, fill_cost_even = 0;
  double read_seconds = 0, pack_seconds = 0, alltoall_seconds = 0, fill_seconds = 0, finish_seconds = 0;
};

// Writes the target files by the exchange; collective over all ranks of `mpi`. `files`: every
// target file, in the same order on every rank, laid out with its sources; `plan` made from them;
// this rank creates and writes (as `options` say) the files the plan gives it.
ExchangeStats run_exchange(const std::vector<LaidOutFile>& files, const WriteOptions& options,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           parallel::MpiSession& mpi, int threads, const Reporter& reporter = {});

}  // namespace ucpkit::reshard
