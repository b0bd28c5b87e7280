// Splitting work across MPI ranks by size.
#include "parallel/share.h"

#include <algorithm>
#include <numeric>

namespace ucpkit::parallel {

std::vector<int> assign_by_size(const std::vector<uint64_t>& sizes, int ranks) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<uint64_t> load(std::max(ranks, 1), 0);
  std::vector<int> owner(sizes.size(), 0);
  for (size_t i : order) {
    int best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = best;
    load[best] += sizes[i];
  }
  return owner;
}

std::vector<size_t> share_of(const std::vector<uint64_t>& sizes, int ranks, int rank) {
  const std::vector<int> owner = assign_by_size(sizes, ranks);
  std::vector<size_t> mine;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (owner[i] == rank) mine.push_back(i);
  std::stable_sort(mine.begin(), mine.end(), [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  return mine;
}

}  // namespace ucpkit::parallel
