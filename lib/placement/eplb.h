// DeepSeek EPLB (expert-parallelism load balancer), hierarchical and global, as its README describes.
#pragma once
#include <vector>

#include "placement/cluster.h"
#include "placement/loads.h"

namespace ucpkit::placement {

// EPLB's rebalance: replicate experts greedily by largest load per replica, then balanced packing
// (heaviest item to the lightest pack that still has room). Hierarchical when groups % nodes == 0:
// expert groups packed onto nodes, replicas made within each node, then packed onto the node's GPUs;
// otherwise (or with `force_global`) one global pass over all GPUs. Arithmetic in float32 like the
// reference so that ties resolve identically. Returns one placement per layer (phy2log + replica rank).
std::vector<LayerPlacement> eplb_rebalance(const LoadMatrix& loads, const Cluster& cluster, int groups,
                                           bool force_global);

}  // namespace ucpkit::placement
