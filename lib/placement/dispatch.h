// Token dispatch plan for uneven replicas: per physical slot, the share of its expert's tokens it
// takes, chosen so that the most loaded GPU is as light as any split of the tokens allows.
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

struct DispatchPlan {
  std::vector<double> share;      // per physical slot: fraction of its expert's tokens (sums to 1 per expert)
  std::vector<double> gpu_loads;  // tokens per GPU under `share`
  double max_load = 0, mean_load = 0, balancedness = 1;
};

// Minimizes the largest GPU load over all splits of every expert's tokens among the GPUs holding
// it (a replica may take any share, not only t_e / r_e). The optimum is
// T* = max over expert sets A of t(A) / |GPUs holding some expert of A| (max-flow min-cut); it is
// found by max-flow with GPU capacity T, raising T to the ratio of the min cut until the flow
// routes every token (Dinkelbach iteration, exact up to rounding). Inside a GPU a flow is split
// evenly over that GPU's slots of the expert; an expert without tokens keeps equal shares.
DispatchPlan dispatch_plan(const std::vector<int>& phy2log, const std::vector<double>& loads, const Cluster& cluster);

}  // namespace ucpkit::placement
