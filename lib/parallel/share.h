// How work is split across MPI ranks: deterministic, so every rank computes the same split without
// talking to the others.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ucpkit::parallel {

// Largest first onto the least-loaded of `ranks` bins (ties: lowest rank); returns the bin of each
// item.
std::vector<int> assign_by_size(const std::vector<uint64_t>& sizes, int ranks);

// The items assign_by_size gives to `rank`, largest first (equal sizes in input order): the order in
// which a rank works through its share, so its threads start on the large items.
std::vector<size_t> share_of(const std::vector<uint64_t>& sizes, int ranks, int rank);

}  // namespace ucpkit::parallel
