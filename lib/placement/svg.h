// SVG drawing of a plan: GPU load before/after (summed over layers) and one layer's replica map.
#pragma once
#include <string>
#include <vector>

#include "placement/plan.h"

namespace ucpkit::placement {

// GPU loads of a placement summed over layers: GPUs node-major, `gpus_per_node` per node, with the
// physical id of every node (a plan's node_ids).
struct GpuChart {
  std::vector<int> node_ids;
  int gpus_per_node = 0;
  std::vector<double> loads;
};

// The chart of `plan` itself.
GpuChart plan_gpu_chart(const Plan& plan);

// Bars of `before` (the current plan, or a baseline; empty to draw only the plan) and of `plan`,
// aligned by physical node id: every GPU of either placement has its place, nodes in the order of
// `before` then nodes only the plan has; a node that only `before` has is marked "failed", one
// only the plan has "new".
std::string plan_svg(const Plan& plan, const GpuChart& before, const std::string& before_label, int layer);

}  // namespace ucpkit::placement
