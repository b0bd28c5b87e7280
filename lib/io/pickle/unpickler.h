// A pickle interpreter (protocols 0-5) producing a Value tree; torch-aware (tensors, Size, dtypes)
// and keeping every unknown class as an opaque Object. Bounded: every length is checked against
// the input, nesting depth, container counts and the memory of the values built are limited,
// reference cycles are rejected.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::pickle {

struct UnpickleOptions {
  // Called for each persistent id (BINPERSID/PERSID); returns what the id stands for.
  std::function<ValuePtr(const ValuePtr& pid)> persistent_load;
  size_t max_depth = 1000;  // nesting of containers in the result
  // Memory the values built may take (counted as they are pushed); 0: 64 MiB + 48 x the pickle's size
  // (the checkpoints' pickles measured take under 30 x: docs/reliability.md).
  uint64_t max_memory = 0;
  // Sees the pairs a SETITEM, SETITEMS or DICT is about to add to a dict (`kv`: key, value, key,
  // value, ...) and may replace any of them, moving what it replaces into `dropped`: a reader that
  // converts entries as they arrive never holds a large pickle whole (DCP metadata of 100,000 tensors).
  // What it drops is freed unless shared, and no longer counted against max_memory. With a
  // hook, memo entries nothing fetches are not kept (a walk over the opcodes finds the fetched ones).
  std::function<void(std::vector<ValuePtr>& kv, std::vector<ValuePtr>& dropped)> on_dict_items;
};

// Whether `torch.<name>` is a dtype ucpkit reads (float32, half, bfloat16...: io/dtype.h's), and which.
bool is_torch_dtype_name(std::string_view name, DType& out);

// Decodes one pickle from `data`; `name` (the file) prefixes every error. Sets `consumed` to the
// number of bytes up to and including STOP (several pickles can follow each other: legacy format).
ValuePtr unpickle(std::span<const uint8_t> data, const std::string& name, const UnpickleOptions& options = {},
                  size_t* consumed = nullptr);

}  // namespace ucpkit::pickle
