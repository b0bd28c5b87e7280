// Small clusters: the placement meeting f with the lightest most loaded GPU (equal shares), found by
// branch and bound, as balanced-ft's last improvement step (its heuristics miss the
// optimum by up to 4.7 points on tiny clusters).
#pragma once
#include <optional>
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

struct ExactSearchLimits {
  int max_slots = 24;                 // larger clusters are not searched
  long long max_allocations = 20000;  // replica allocations worth packing (bounded below the incumbent)
  long long max_steps = 400000;       // packing steps over all allocations
};

// A placement (phy2log) whose most loaded GPU is lighter than `incumbent` by more than a relative
// 1e-9 and the lightest of all placements where every expert sits on at least f distinct nodes, or
// nullopt when there is none or the search exceeds a limit (then nothing is claimed). Every slot
// holds a replica; a replica of e carries t_e / r_e.
std::optional<std::vector<int>> exact_lighter_placement(const std::vector<double>& t, const Cluster& cluster, int f,
                                                        double incumbent, const ExactSearchLimits& limits = {});

}  // namespace ucpkit::placement
