// balanced-ft: the default placement. Every expert gets at least f replicas on f distinct nodes,
// the replicas are packed for balance (largest share first onto the least loaded GPU, then swaps off
// the most loaded GPU), and the node sets of experts that sit on exactly f nodes are overlapped for
// recovery when k >= f nodes fail, without raising the most loaded GPU.
#pragma once
#include <vector>

#include "placement/cluster.h"
#include "placement/loads.h"

namespace ucpkit::placement {

// Replica counts: every expert `floor` replicas, then the remaining slots one at a time to the expert
// with the largest load per replica (EPLB's replication rule started from a floor of f; ties to the
// lower id). With `greedy_slots` < slots, the greedy stops after that many replicas in all and the
// rest go one at a time to the least loaded experts (a hot expert with fewer, heavier replicas can
// pack better when a GPU holds several slots). Throws UsageError when floor * experts > slots.
std::vector<int> floor_greedy_allocation(const std::vector<double>& loads, long long slots, int floor,
                                         long long greedy_slots = -1);

struct BalancedFtLayerInfo {
  const char* packing = "";  // "node-spread" or "plain" LPT (or "sorted-pairs", "dominant-*", "exact", "blocked"),
                             // whichever balanced better
  int node_sets_before = 0, node_sets_after = 0;  // distinct node sets of experts on exactly f nodes
  long long greedy_slots = 0;     // replicas given by the largest-share rule (the rest to light experts)
  bool mro = false;               // the MRO placement of the same replicas won (as balanced, no less recoverable)
  bool threshold_search = false;  // the threshold search (threshold_search.h) lowered the most loaded GPU
};

// The most loaded GPU of EPLB's global placement approximated in double precision: floor 1, the
// largest-share rule over all slots, largest share first onto the least loaded GPU with room.
double eplb_reference_max_load(const std::vector<double>& loads, const Cluster& cluster);

// Placements that trade balance for recovery when f nodes fail, from balanced-ft's `phy2log`: its
// node sets of f-node experts merged with 1-50% slack on the most loaded GPU, and its replica counts
// with the f-replica experts packed first into blocks of f nodes, q per node for q = 1, 2, 4, ... up
// to a node's slots (fewer node sets for an f-node failure to hit). For --recovery-weight.
std::vector<std::vector<int>> recovery_candidates(const std::vector<int>& phy2log, const std::vector<double>& t,
                                                  const Cluster& cl, int f);

// What balanced-ft refuses before placing any layer of `loads`: loads that do not fit the cluster
// (check_fits), and f above the node count (a UsageError naming the option).
void check_balanced_ft_request(const LoadMatrix& loads, const Cluster& cluster, int f);

// One layer. f must be 1..nodes with f * experts <= slots (checked by the caller's allocation).
LayerPlacement balanced_ft_layer(const std::vector<double>& loads, const Cluster& cluster, int f,
                                 BalancedFtLayerInfo* info = nullptr);

}  // namespace ucpkit::placement
