// A pickle interpreter (protocols 0-5) producing a Value tree; torch-aware (tensors, Size, dtypes)
// and keeping every unknown class as an opaque Object. Bounded: every length is checked against
// the input, nesting depth, container counts and the memory of the values built are limited,
// reference cycles are rejected.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "io/pickle/value.h"

namespace ucpkit::pickle {

struct UnpickleOptions {
  // Called for each persistent id (BINPERSID/PERSID); returns what the id stands for.
  std::function<ValuePtr(const ValuePtr& pid)> persistent_load;
  size_t max_depth = 1000;  // nesting of containers in the result
  // Memory the values built may take (counted as they are pushed); 0: 64 MiB + 48 x the pickle's size
  // (the checkpoints' pickles measured take under 30 x: docs/reliability.md).
  uint64_t max_memory = 0;
};

// Decodes one pickle from `data`; `name` (the file) prefixes every error. Sets `consumed` to the
// number of bytes up to and including STOP (several pickles can follow each other: legacy format).
ValuePtr unpickle(std::span<const uint8_t> data, const std::string& name, const UnpickleOptions& options = {},
                  size_t* consumed = nullptr);

}  // namespace ucpkit::pickle
