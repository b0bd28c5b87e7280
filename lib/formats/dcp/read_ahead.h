// Whole tensors read ahead on a thread of their own, in the order a writer will ask for them: the reading (an
// item's zip parsed, its bytes copied out of the map) runs on one core while the writing (chunks cut, pickled,
// zipped, copied into the data file's block) runs on another. On a 100,000-tensor reshard the two were about
// equal halves of one core.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "formats/dcp/metadata.h"
#include "formats/dcp/save_plan.h"
#include "io/tensor.h"

namespace ucpkit::formats::dcp {

// `whole(e)` for the tensor entries of `order`, read ahead; the function returned gives the same tensor as
// `whole(e)` for any entry. Only entries of at most `max_entry_bytes` are read ahead (a larger one is read
// when asked for: two large tensors in memory at once is what a reshard must not need), and about `max_bytes` of them
// wait, twice that at most (those read and those the caller took at once, a batch each way). Asked for an entry that is
// not the next of `order`, it skips ahead to it (the ones between are dropped) or, when the entry is not ahead, reads
// it itself. An error reading ahead is thrown when its entry is asked for. The reading thread stops, and is joined,
// when the last copy of the function goes. `whole` must be safe to call on another thread than the caller's while the
// caller runs.
std::function<Tensor(const Entry&)> read_ahead(std::function<Tensor(const Entry&)> whole, std::vector<const Entry*> order,
                                               uint64_t max_bytes = uint64_t{16} << 20,
                                               uint64_t max_entry_bytes = uint64_t{16} << 20);

// The tensor entries of `plan` in the order write_dcp_files asks for them (its write order when it has one).
std::vector<const Entry*> read_order(const SavePlan& plan);

}  // namespace ucpkit::formats::dcp
