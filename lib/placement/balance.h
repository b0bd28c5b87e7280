// Load balance of a placement: GPU loads and balancedness (mean GPU load / max GPU load).
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

// Load of every GPU: sum over its slots of (expert load / replica count of that expert).
std::vector<double> gpu_loads(const std::vector<int>& phy2log, const std::vector<double>& loads,
                              const Cluster& cluster);
// mean / max of the GPU loads (1 when all are zero).
double balancedness(const std::vector<double>& gpu_loads);
double balancedness(const std::vector<int>& phy2log, const std::vector<double>& loads, const Cluster& cluster);

}  // namespace ucpkit::placement
