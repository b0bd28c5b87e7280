// Lazarus replica allocation: how many replicas each expert gets, from its load and the slot budget.
#pragma once
#include <vector>

namespace ucpkit::placement {

// Experts sorted by load ascending (ties by id); with N*c slots in all and threshold f:
//   r_e = max(f, floor(t_e / sum_{e' >= e} t_e' * (N*c - sum_{e' < e} r_e'))),
// so sum r_e = N*c and every expert has at least f replicas. When all remaining loads are zero the
// remaining slots are split evenly. Throws UsageError when f < 1, f > nodes or f * E > slots.
std::vector<int> lazarus_allocation(const std::vector<double>& loads, int nodes, int slots_per_node,
                                    int fault_tolerance);

// Expert ids sorted by load ascending, ties by id: the order the Lazarus formula walks.
std::vector<int> ascending_load_order(const std::vector<double>& loads);

}  // namespace ucpkit::placement
