// Lazarus allocation (formula (1) of the paper, restated in product.md).
#include "placement/allocation.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "core/error.h"
#include "placement/cluster_request.h"

namespace ucpkit::placement {

std::vector<int> ascending_load_order(const std::vector<double>& loads) {
  std::vector<int> order(loads.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return loads[a] < loads[b]; });
  return order;
}

std::vector<int> lazarus_allocation(const std::vector<double>& loads, int nodes, int slots_per_node, int f) {
  const long long E = static_cast<long long>(loads.size());
  const long long total = 1LL * nodes * slots_per_node;
  if (f < 1) throw UsageError(fault_tolerance_option(f) + " is impossible");
  if (f > nodes)
    throw UsageError(fault_tolerance_option(f) + " is impossible with " + std::to_string(nodes) +
                     " nodes (each expert needs replicas on f distinct nodes)");
  if (E > total)
    throw UsageError(std::to_string(E) + " experts do not fit in " + std::to_string(total) + " replica slots");
  if (f * E > total)
    throw UsageError(fault_tolerance_option(f) + " is impossible: " + std::to_string(E) + " experts x " +
                     std::to_string(f) + " replicas exceed " + std::to_string(total) + " slots");

  std::vector<int> order = ascending_load_order(loads);
  // Suffix sums of loads in ascending order: sum_{e' >= e} t_e'.
  std::vector<double> suffix(E + 1, 0.0);
  for (long long i = E - 1; i >= 0; --i) suffix[i] = suffix[i + 1] + loads[order[i]];

  std::vector<int> r(E, 0);
  long long remaining = total;
  for (long long i = 0; i < E; ++i) {
    const long long left = E - i;
    long long share;
    if (i == E - 1) {
      share = remaining;  // t_e / sum_{e' >= e} t_e' = 1 for the last (most loaded) expert
    } else if (suffix[i] > 0) {
      share = static_cast<long long>(std::floor(loads[order[i]] / suffix[i] * static_cast<double>(remaining)));
    } else {
      share = remaining / left;
    }
    // The rest must still cover f replicas for every expert after this one.
    share = std::min(share, remaining - f * (left - 1));
    r[order[i]] = static_cast<int>(std::max<long long>(f, share));
    remaining -= r[order[i]];
  }
  return r;
}

}  // namespace ucpkit::placement
