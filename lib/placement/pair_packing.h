// Two slots per GPU (S = 2): every GPU holds a pair of replicas. For given replica counts r the
// pairing with the lightest most loaded GPU (nodes aside, equal shares t_e / r_e) is the sorted one,
// the largest share with the smallest, the second largest with the second smallest, ... (exchange
// argument: docs/moe-replace.md, "Two slots per GPU"), so the only choice left is r. balanced-ft uses
// this as one more candidate where its largest-share rule and LPT packing pair badly (on
// 64 x 2 x 2, f = 3, 0.892 where the sorted pairing of a better r reaches 0.926).
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

struct PairingValue {
  double max = 0;        // the most loaded GPU of the sorted pairing
  long long at_max = 0;  // pairs within a relative 1e-12 of it
};

// The sorted pairing of allocation r (sum r even; experts with r_e = 0 hold nothing).
PairingValue sorted_pairing(const std::vector<int>& r, const std::vector<double>& t);

// Local search over allocations with r_e >= f and the same sum: one replica moves from one expert to
// another while that lowers (max, pairs at max), at most `max_steps` moves; every move is tried up to
// 64 experts, above that the 16 first receivers (the experts of the pairs at the maximum first) with
// the 16 donors whose share rises least. Where there are at most 300,000 allocations, every one is
// tried instead (the result is then the best sorted pairing over all of them).
std::vector<int> improve_pair_allocation(std::vector<int> r, const std::vector<double>& t, int f, int max_steps);

// Iterated local search: `restarts` times, 2 to 9 replicas moved between experts picked by a
// fixed-seed generator (r_e >= f kept) from the best allocation so far, then improve_pair_allocation
// with `max_steps`; the result is kept when its sorted pairing is lighter (or as light with fewer
// pairs at the maximum). improve_pair_allocation stops at the first allocation no single move
// improves (on 24 x 2 x 2, f = 3, log-normal, 0.9743 where restarts reach 0.98).
std::vector<int> restart_pair_allocation(std::vector<int> r, const std::vector<double>& t, int f, int max_steps,
                                         int restarts);

// phy2log of the sorted pairing of r on a cluster with 2 slots per GPU (sum r = slots): pair k, in
// order of its smaller share, on node k mod N, GPU k / N of that node, so the consecutive replicas of
// one expert land on different nodes (a fault-tolerance repair may still be needed).
std::vector<int> sorted_pair_layout(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl);

}  // namespace ucpkit::placement
