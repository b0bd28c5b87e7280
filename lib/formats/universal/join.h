// How the tensor-parallel slices of one parameter become its universal tensor and back: one row per
// patterns::JoinKind (join, split, the dimension split, the keys the state file records), so the
// four directions cannot disagree. DeepSpeed's two sides: merge_tp_slices (checkpoint/
// ds_to_universal.py:339-458 at edaa72212) joins, load_hp_checkpoint_state (checkpoint/
// universal_checkpoint.py) cuts a rank's slice again.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "formats/universal/state_file.h"
#include "io/tensor.h"
#include "patterns/pattern_set.h"

namespace ucpkit::formats::universal {

struct JoinOptions {
  double tolerance = 0;  // TP-replicated copies may differ by at most this (absolute); 0 = bitwise
};

// Joins `slices` (one per TP rank, in rank order) of parameter `name`; throws Error naming the
// parameter on a shape mismatch or on replicas that differ.
Tensor join(const std::string& name, const std::vector<Tensor>& slices, const patterns::ParamRule& rule,
            const patterns::PatternSet& set, const JoinOptions& options = {});

// TP rank `t` of `tp` of a tensor of shape `full` (not a scalar): `pieces` (start, length) along `dim`,
// in order, make up the rank's slice of shape `shape`. Throws Error when TP does not divide what it cuts.
struct Split {
  int dim = 0;
  std::vector<std::pair<int64_t, int64_t>> pieces;
  std::vector<int64_t> shape;
};
Split split(const std::string& name, const std::vector<int64_t>& full, const patterns::ParamRule& rule,
            const patterns::PatternSet& set, int tp, int t);

// The dimension the TP slices are cut along, or -1 when every rank holds the whole tensor.
int split_dim(const patterns::ParamRule& rule, const patterns::PatternSet& set);

// Sets the keys merge_tp_slices records for this join (cat_dim, param_n_sub_params, sub_param_shape).
void record_join(const patterns::ParamRule& rule, const patterns::PatternSet& set, StateFile& file);

}  // namespace ucpkit::formats::universal
