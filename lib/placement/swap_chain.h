// Small clusters: swaps of two replicas off the most loaded GPU that break fault tolerance, each
// followed by a second swap elsewhere that restores it (on 5 x 2 x 4, f = 3, the one
// exchange that lowers the most loaded GPU puts an expert twice on one node, and single swaps, which
// must keep f at every step, cannot reach 0.937 from 0.896).
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

// While the most loaded GPU can be lowered by a swap of one of its replicas with one elsewhere,
// directly or followed by a repairing swap, with every GPU the two swaps touch ending below the old
// maximum and every expert on at least f distinct nodes (as it was before): apply it. Returns the
// improved phy2log (the input when nothing applies). `max_rounds` caps the applied moves.
std::vector<int> swap_chain_improve(std::vector<int> phy2log, const std::vector<double>& t, const Cluster& cl, int f,
                                    int max_rounds);

}  // namespace ucpkit::placement
