// Recovery probability: P(every expert keeps a replica on a surviving node) when k of N nodes fail
// uniformly at random; exact enumeration when C(N,k) is small enough, Monte Carlo otherwise.
#pragma once
#include <cstdint>
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

// For every expert of one layer, the set of nodes holding at least one of its replicas.
class ExpertNodeSets {
 public:
  ExpertNodeSets(int experts, int nodes);
  static ExpertNodeSets from_layer(const std::vector<int>& phy2log, const Cluster& cluster, int experts);
  static ExpertNodeSets from_nodes(const std::vector<std::vector<int>>& node_experts, int experts);

  void add(int expert, int node);
  int experts() const { return experts_; }
  int nodes() const { return nodes_; }
  int degree(int expert) const { return degree_[expert]; }
  bool contains(int expert, int node) const { return (bits(expert)[node >> 6] >> (node & 63)) & 1; }
  const uint64_t* bits(int expert) const { return bits_.data() + static_cast<size_t>(expert) * words_; }
  int words() const { return words_; }
  std::vector<int> node_list(int expert) const;

 private:
  int experts_, nodes_, words_;
  std::vector<uint64_t> bits_;
  std::vector<int> degree_;
};

struct RecoveryOptions {
  int max_failures = 4;          // k = 1..K (capped at nodes - 1)
  uint64_t mc_samples = 100000;  // Monte Carlo samples per k
  uint64_t seed = 1;
  double exact_limit = 1e6;  // enumerate exactly when C(N,k) <= this
};

struct RecoveryEstimate {
  int failed_nodes = 0;
  double probability = 1.0;
  bool exact = true;
  uint64_t samples = 0;                // Monte Carlo samples (0 when exact)
  double ci_low = 1.0, ci_high = 1.0;  // 95% interval (Wilson per layer; normal over the layer mean)
};

double binomial(int n, int k);

// Fixes N, K and the Monte Carlo failure sets (drawn once from the seed, so every layer and every
// candidate placement is judged on the same samples).
class RecoveryModel {
 public:
  RecoveryModel(int nodes, const RecoveryOptions& options);
  int max_failures() const { return max_k_; }
  bool exact(int k) const { return binomial(nodes_, k) <= options_.exact_limit; }
  const RecoveryOptions& options() const { return options_; }

  // Estimates for k = 1..K. With `survivals`, adds this layer's per-sample survival to
  // (*survivals)[k][sample] for the Monte Carlo k, to aggregate over layers.
  std::vector<RecoveryEstimate> evaluate(const ExpertNodeSets& sets,
                                         std::vector<std::vector<uint32_t>>* survivals = nullptr) const;
  // The estimate for one k.
  RecoveryEstimate evaluate_one(const ExpertNodeSets& sets, int k,
                                std::vector<std::vector<uint32_t>>* survivals = nullptr) const;
  // Mean over layers per k, with the interval from the per-sample layer averages for Monte Carlo k.
  std::vector<RecoveryEstimate> aggregate(const std::vector<std::vector<RecoveryEstimate>>& per_layer,
                                          const std::vector<std::vector<uint32_t>>& survivals) const;
  std::vector<std::vector<uint32_t>> new_survivals() const;

 private:
  int nodes_, max_k_;
  RecoveryOptions options_;
  std::vector<std::vector<int>> samples_;  // per k: mc_samples * k node ids (empty when exact)
  // Per k and node: the samples in which that node failed, ascending (the inverse of samples_).
  std::vector<std::vector<std::vector<uint32_t>>> failed_in_;
  // Per k >= 2: the samples in which both nodes a < b failed, as CSR over the pair a * nodes + b:
  // dense on small clusters (pair_start_[k] has nodes * nodes + 1 offsets into pair_samples_[k],
  // pair_keys_[k] empty), sparse on large ones (pair_keys_[k] lists the pairs some sample fails,
  // sorted, pair_start_[k] one offset per listed pair plus the end).
  std::vector<std::vector<uint32_t>> pair_start_, pair_samples_;
  std::vector<std::vector<uint64_t>> pair_keys_;
};

}  // namespace ucpkit::placement
