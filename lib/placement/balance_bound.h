// Upper bounds on the balancedness any placement meeting fault tolerance f can reach, computed from
// the loads and the cluster alone (no placement algorithm involved). Proof: docs/moe-replace.md,
// section "Balance bound under the floor f".
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

struct FtBalanceBound {
  double mean_load = 0;                // sum of loads / GPUs (the same for every placement)
  double max_load_lower = 0;           // no placement meeting f has a lighter most loaded GPU (equal shares)
  double balancedness = 1;             // mean_load / max_load_lower: no placement meeting f balances better
  double dispatch_max_load_lower = 0;  // the same with any split of an expert's tokens over its replicas
  double dispatch_balancedness = 1;
};

// Every slot holds a replica (as every algorithm here fills them), every expert has replicas on at
// least f distinct nodes (so r_e >= f), a replica of e carries t_e / r_e (equal shares) or, for the
// dispatch bound, any split of t_e over e's replicas. Requires 1 <= f and f * experts <= slots
// (otherwise no placement meets f; the result is then the trivial bound 1).
FtBalanceBound ft_balance_bound(const std::vector<double>& loads, const Cluster& cluster, int f);

}  // namespace ucpkit::placement
