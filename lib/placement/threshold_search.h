// Where the floor f binds: a randomized local search (simulated annealing with a fixed seed, so the
// result is deterministic) that drives every GPU below a threshold, for the layers the constructive
// steps and the descent of reduce_max leave short of EPLB's balance (on 128 x 8 x 4 with
// skewed or log-normal loads, f = 2 or 3, balanced-ft stopped 0.2-2.6% below eplb-global, which
// gives some expert fewer than f replicas; on 5 x 2 x 4 log-normal, 0.6% below).
#pragma once
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

struct ThresholdSearchLimits {
  long long iterations = 100000;  // moves tried per attempt
  int attempts = 3;               // thresholds tried
};

// The search minimizes the excess sum_g max(0, load_g - T) over slot swaps and slot rewrites (one
// slot to another expert: the replica counts change; not between two experts with more than 256
// replicas together, whose every GPU a rewrite updates), never letting an expert fall below f replicas
// or below min(f, its distinct nodes in `phy2log`) distinct nodes; moves that raise the excess are
// taken with the annealing probability. T is first `goal`; after an attempt that does not reach it,
// halfway between `goal` and the best most loaded GPU found. Returns the placement with the lightest
// most loaded GPU seen at the end of an attempt, or `phy2log` itself when none is lighter (by a
// relative 1e-12). Every slot must hold an expert (else `phy2log` is returned).
std::vector<int> threshold_search(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl,
                                  int f, double goal, const ThresholdSearchLimits& limits = {});

}  // namespace ucpkit::placement
