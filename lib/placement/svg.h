// SVG drawing of a plan: GPU load before/after (summed over layers) and one layer's replica map.
#pragma once
#include <string>
#include <vector>

#include "placement/plan.h"

namespace ucpkit::placement {

// `before` are per-GPU loads of the previous (or baseline) placement, empty to draw only `after`.
std::string plan_svg(const Plan& plan, const std::vector<double>& before, const std::string& before_label, int layer);

}  // namespace ucpkit::placement
