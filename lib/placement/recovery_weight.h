// --recovery-weight w: one placement per layer between balanced-ft (w = 0, the most balanced) and the
// most recoverable placement under the same f (w = 1: at least Lazarus' MRO recovery when f nodes
// fail), chosen by the weighted sum of balancedness and p(f).
#pragma once
#include <string>
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

// P(every expert keeps a replica) when f of the N nodes fail, exactly: with every expert on at least
// f distinct nodes, an expert is lost exactly when it sits on exactly f nodes and those fail, so
// p(f) = 1 - (distinct node sets of such experts) / C(N, f). Requires every expert on >= f nodes.
double f_failure_recovery(const std::vector<int>& phy2log, const Cluster& cluster, int experts, int f);

struct WeightedChoice {
  std::string source;                     // "balanced-ft", "overlap", "blocked", "mro" or "lazarus"
  double balancedness = 1, recovery = 1;  // of the chosen placement; recovery = p(f)
};

// The candidate with the largest (1 - w) * balancedness + w * p(f), ties to the more balanced, among:
// balanced-ft's placement `balanced`, recovery_candidates of it (balanced_ft.h), the MRO placement of
// its replica counts, and `lazarus` (the lazarus algorithm's placement of the same layer). Every
// candidate keeps every expert on >= f nodes. w = 0 returns `balanced`.
std::vector<int> recovery_weighted_layer(const std::vector<double>& t, const Cluster& cluster, int f, double w,
                                         const std::vector<int>& balanced, const std::vector<int>& lazarus,
                                         WeightedChoice* choice = nullptr);

// The candidates of recovery_weighted_layer whose most loaded GPU is no heavier than `balanced`'s: the
// one with the largest p(f), ties to the more balanced, and `balanced` itself when none is more
// recoverable. So the layer keeps at least the default's balance and p(f) (a point of the
// front that dominates the default wherever some layer has a more recoverable candidate for free).
std::vector<int> recovery_free_layer(const std::vector<double>& t, const Cluster& cluster, int f,
                                     const std::vector<int>& balanced, const std::vector<int>& lazarus,
                                     WeightedChoice* choice = nullptr);

}  // namespace ucpkit::placement
