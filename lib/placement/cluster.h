// The cluster a placement targets: nodes x GPUs per node x replica slots per GPU, EPLB slot numbering.
#pragma once
#include <string>
#include <vector>

namespace ucpkit::placement {

// Physical slot index = gpu * slots_per_gpu + slot; GPU g lives on node g / gpus_per_node (as in EPLB).
struct Cluster {
  int nodes = 0;
  int gpus_per_node = 0;
  int slots_per_gpu = 0;

  int gpus() const { return nodes * gpus_per_node; }
  int slots_per_node() const { return gpus_per_node * slots_per_gpu; }
  int slots() const { return nodes * slots_per_node(); }
  int gpu_of_slot(int phys) const { return phys / slots_per_gpu; }
  int node_of_slot(int phys) const { return phys / slots_per_node(); }
  int node_of_gpu(int gpu) const { return gpu / gpus_per_node; }
  std::string describe() const;
};

// Throws UsageError unless all three sizes are positive and the slot count fits an int.
void validate_cluster(const Cluster& cluster);

// One MoE layer's placement: the logical expert in every physical slot and, per slot, the rank of
// that replica among its expert's replicas (log2phy lists replicas in rank order).
struct LayerPlacement {
  std::vector<int> phy2log;
  std::vector<int> phyrank;
};

// Replica count of every logical expert.
std::vector<int> logical_counts(const std::vector<int>& phy2log, int experts);
// Ranks by order of appearance, for algorithms that do not define their own.
std::vector<int> ranks_by_appearance(const std::vector<int>& phy2log, int experts);
// log2phy padded with -1 to `width` entries per expert.
std::vector<std::vector<int>> log2phy(const LayerPlacement& layer, int experts, int width);

// Fills slots from a node-level assignment (multiset of experts per node): inside each node, replicas
// go to GPUs longest-processing-time first (heaviest replica to the least loaded GPU with a free slot,
// preferring a GPU that lacks that expert), so GPU loads within a node are balanced.
LayerPlacement layout_nodes(const std::vector<std::vector<int>>& node_experts, const std::vector<double>& loads,
                            const Cluster& cluster);

}  // namespace ucpkit::placement
