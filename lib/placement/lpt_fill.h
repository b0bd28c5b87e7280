// Largest-share-first packing of replica counts onto GPUs (balanced-ft's packing step).
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

// Which nodes may take the next replica of an expert (when one of them has a free slot; else any):
// any node; `levels`: nodes holding at most replicas-placed-so-far / nodes of them (replicas round
// over the nodes, balanced-ft); `new_nodes_first`: nodes not holding the expert until every node
// holds it (Lazarus' balance-driven layout, `prefer_new_node`).
enum class NodeRule { any, levels, new_nodes_first };

// Largest share first (t_e / r_e, ties by id) onto the least loaded GPU with a free slot (ties to
// the lower GPU id) among the GPUs on eligible nodes (NodeRule), or on any node when no eligible
// one has a free slot. Slots
// already set in `phy2log` (>= 0) stay; experts with `skip[e]` are not placed (the caller did).
//
// Cost: a level of an expert whose picks all land on distinct eligible nodes (the usual case: fewer
// replicas than nodes with room) is chosen at once, the q least loaded nodes by nth_element, O(N)
// per expert and level instead of O(q log N) tree updates per replica; the rest (more replicas than
// eligible nodes, a level left unfinished) goes one replica at a time through two tournament trees
// over the nodes. Both give the slots a scan of all GPUs in (load, id) order would give.
std::vector<int> lpt_fill(std::vector<int> phy2log, const std::vector<int>& r, const std::vector<double>& t,
                          const Cluster& cl, NodeRule rule, const std::vector<char>& skip);
// spread: NodeRule::levels, else NodeRule::any.
std::vector<int> lpt_fill(std::vector<int> phy2log, const std::vector<int>& r, const std::vector<double>& t,
                          const Cluster& cl, bool spread, const std::vector<char>& skip);

// lpt_fill onto an empty cluster with nothing skipped.
std::vector<int> lpt_pack(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, NodeRule rule);
std::vector<int> lpt_pack(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, bool spread);
// lpt_pack, or an empty vector once some GPU's load exceeds `limit` (loads only grow while packing,
// so the packing's most loaded GPU would exceed it): for a candidate only wanted when it packs at
// most that well.
std::vector<int> lpt_pack_below(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, bool spread,
                                double limit);

}  // namespace ucpkit::placement
