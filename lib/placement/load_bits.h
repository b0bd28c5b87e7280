// Loads as integers that order as the loads do, for comparisons without the branches of comparing
// doubles (lpt_fill's tournament trees, greedy_order's heap).
#pragma once
#include <bit>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace ucpkit::placement {

// The bits of a load >= 0 order as its value (+ 0.0 turns a -0.0 into +0.0, so equal loads have
// equal bits). Only for finite loads >= 0: require_load_bits_order checks the inputs.
inline uint64_t load_bits(double load) { return std::bit_cast<uint64_t>(load + 0.0); }

// Throws Error ("internal: <who> needs finite loads >= 0") when a load is negative, infinite or NaN
// (the loads reader refuses those already; this guards the ordering load_bits relies on).
inline void require_load_bits_order(const std::vector<double>& loads, const char* who) {
  for (double x : loads)
    if (!(x >= 0 && x <= std::numeric_limits<double>::max()))
      throw Error(std::string("internal: ") + who + " needs finite loads >= 0");
}

}  // namespace ucpkit::placement
