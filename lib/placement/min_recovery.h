// --min-recovery k:p: the smallest --recovery-weight whose plan keeps every expert with probability
// at least p when k nodes fail (P(k nodes down), the plan's recovery probability for k).
#pragma once
#include <functional>
#include <string>

namespace ucpkit::placement {

struct MinRecovery {
  int k = 0;     // failed nodes, 1..nodes - 1
  double p = 0;  // target probability, 0..1
};

// "k:p", e.g. "2:0.95". Throws UsageError naming --min-recovery on anything else (k not a positive
// integer, p not a number from 0 to 1).
MinRecovery parse_min_recovery(const std::string& text);

struct MinRecoveryChoice {
  double weight = 0;    // the recovery weight taken
  double achieved = 0;  // its plan's P(k nodes down)
  int evaluations = 0;  // plans made to find it
};

// `achieved(w)` is the plan's P(k nodes down) for --recovery-weight w. w = 0 when it meets p; else,
// when w = 1 meets it, bisection between the largest weight seen failing and the smallest seen
// meeting, 7 halvings (the weight is within 1/128 above the smallest meeting one where P(k) grows with
// w, which the per-layer choice makes usual but does not promise; the weight returned always meets
// p). Throws UsageError when even w = 1 (the most recoverable placement under the same f) falls short,
// naming what it reaches.
MinRecoveryChoice smallest_recovery_weight(const MinRecovery& target, const std::function<double(double)>& achieved);

}  // namespace ucpkit::placement
