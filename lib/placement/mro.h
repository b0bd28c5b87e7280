// Maximum-rank-overlap (MRO) placement of replicas on nodes (Lazarus, section 4.1).
#pragma once
#include <vector>

namespace ucpkit::placement {

struct MroOptions {
  // Every expert gets min(f, replicas, nodes) distinct nodes; swaps repair the paper's construction
  // where its last group runs out of nodes (e.g. 3 experts x 2 replicas on 3 nodes x 2 slots).
  int fault_tolerance = 1;
  // The paper's construction is not optimal when node capacity cuts groups short; on small clusters
  // we then improve it by replica swaps that raise the exact recovery vector (p1, p2, ...)
  // lexicographically. Work limit for that search, in expert-set checks per pass.
  double refine_budget = 5e7;
  // Clusters of at most 6 nodes whose node contents can be chosen in at most this many ways
  // (C(E + c - 1, c) multisets of c experts) are searched exhaustively for the lexicographically best
  // (p(1), ..., p(N-1)), ties to the smallest maximum node load; this covers N <= 6, E <= 6, c <= 3
  // (C(8,3) = 56 and at most 32152 placements). The search gives up after `exhaustive_steps` steps
  // and the construction plus refinement is used instead.
  double exhaustive_node_choices = 100;
  long long exhaustive_steps = 2000000;
};

// Node -> multiset of experts, exactly `slots_per_node` entries per node, for replica counts
// `replicas` (sum = nodes * slots_per_node). Experts in ascending replica order (ties: lower load)
// are cut into consecutive groups of `slots_per_node`; group k takes a block of as many nodes as its
// first (representative) expert has replicas, one replica of every member on each block node (nested
// node sets); the last group is nested over the remaining nodes; leftover replicas fill vacant slots
// on nodes that lack the expert, least loaded node first. Small clusters: see MroOptions.
std::vector<std::vector<int>> mro_placement(const std::vector<int>& replicas, const std::vector<double>& loads,
                                            int nodes, int slots_per_node, const MroOptions& options = {});

// The leftover pass of mro_placement: puts each of `pending`, in order, on a node with room (fewer
// than `slots_per_node` entries) chosen as by a scan of the nodes in index order over those lacking the
// expert (over all with room when none lacks it): the first, replaced by a later one whose load (sum of
// `replica_load` over its entries) is lower by more than 1e-12, or within 1e-12 with more room. Finds
// that node from ordered sets instead of scanning (pending x log nodes instead of pending x nodes).
void place_leftovers(std::vector<std::vector<int>>& nodes, const std::vector<int>& pending,
                     const std::vector<double>& replica_load, int slots_per_node);

// Exact recovery probabilities p(k), k = 1..nodes-1, of a node-level placement by enumerating all
// failure sets (nodes <= 24); used by the refinement and by small-instance diagnostics.
std::vector<double> exact_recovery_vector(const std::vector<std::vector<int>>& node_experts, int experts);

}  // namespace ucpkit::placement
