// Union (the reduce phase's arithmetic): joins the tensor-parallel slices of one parameter state
// by its pattern, and strips vocabulary padding. Pure: tensors in, tensor out.
#pragma once
#include <string>
#include <vector>

#include "io/tensor.h"
#include "patterns/pattern_set.h"

namespace ucpkit::to_universal {

struct UnionOptions {
  double tolerance = 0;  // TP-replicated copies may differ by at most this (absolute); 0 = bitwise
};

// Joins `slices` (one per TP rank, in rank order) of parameter `name`; throws Error naming the
// parameter on a shape mismatch or on replicas that differ.
Tensor union_fragments(const std::string& name, const std::vector<Tensor>& slices, const patterns::ParamRule& rule,
                       const patterns::PatternSet& set, const UnionOptions& options = {});

// Cuts a vocabulary parameter to its first `original_vocab_size` rows (contiguous copy).
Tensor strip_padding(const std::string& name, const Tensor& t, int64_t original_vocab_size);

}  // namespace ucpkit::to_universal
