// Hecate (FSSDP): heterogeneous sharding of all layers' experts and sparse materialization per layer.
#pragma once
#include <vector>

#include "placement/cluster.h"
#include "placement/loads.h"

namespace ucpkit::placement {

// Heterogeneous sharding (Hecate Algorithm 2): every GPU gets the same number of expert shards
// counted over all layers (ceil(L*E / GPUs)); per layer, the top-t experts by load are "overlappable";
// the others are placed first, layers with the most loaded expert first, each expert (heaviest first)
// on the least loaded node (ties: fewer free shard slots) and then its least loaded GPU (same rule);
// the overlappable experts fill the remaining shard slots. Returns owner GPU per [layer][expert].
std::vector<std::vector<int>> hecate_sharding(const LoadMatrix& loads, const Cluster& cluster, int overlap_degree);

// Sparse materialization (Hecate Algorithm 1) for one layer with memory capacity m (experts per GPU,
// 1 <= m <= S; -1: m = S): each expert first occupies a slot on its owner GPU (or, when that GPU has
// m already, the least loaded GPU of the owner's node, or anywhere); if t <= m the top-t experts are
// materialized on every GPU with room, else the free capacity is given to the top-t experts in
// proportion to load, each expert's copies on nodes lacking it first; capacity still free goes to
// the expert with the largest load per replica. The plan format has exactly S slots per GPU: when
// m < S, each GPU's other S - m slots repeat experts it already holds (largest load per replica
// first), so no GPU holds more than m distinct experts. An expert's run of at least `tree_from`
// copies is placed through a tree over the nodes (the same choices as one copy at a time, which
// tests get with a large `tree_from`).
inline constexpr int kHecateTreeFrom = 32;
LayerPlacement hecate_materialize(const std::vector<double>& loads, const std::vector<int>& owner,
                                  const Cluster& cluster, int overlap_degree, int memory = -1,
                                  int tree_from = kHecateTreeFrom);

}  // namespace ucpkit::placement
