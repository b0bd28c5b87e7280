// Union (the reduce phase's arithmetic): joins the tensor-parallel slices of one parameter state
// by its pattern (the join table, formats/universal/join.h), and strips vocabulary padding. Pure:
// tensors in, tensor out.
#pragma once
#include <string>
#include <vector>

#include "formats/universal/join.h"
#include "io/tensor.h"
#include "patterns/pattern_set.h"

namespace ucpkit::to_universal {

using UnionOptions = formats::universal::JoinOptions;

// Joins `slices` (one per TP rank, in rank order) of parameter `name`; throws Error naming the
// parameter on a shape mismatch or on replicas that differ.
inline Tensor union_fragments(const std::string& name, const std::vector<Tensor>& slices,
                              const patterns::ParamRule& rule, const patterns::PatternSet& set,
                              const UnionOptions& options = {}) {
  return formats::universal::join(name, slices, rule, set, options);
}

// Cuts a vocabulary parameter to its first `original_vocab_size` rows (contiguous copy).
Tensor strip_padding(const std::string& name, const Tensor& t, int64_t original_vocab_size);

}  // namespace ucpkit::to_universal
