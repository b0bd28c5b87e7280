// --min-recovery (see min_recovery.h and docs/moe-replace.md, "Balance or recovery").
#include "placement/min_recovery.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace ucpkit::placement {

namespace {

std::string number(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

}  // namespace

MinRecovery parse_min_recovery(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return UsageError("--min-recovery " + text + ": " + why + " (expected k:p, e.g. 2:0.95: P(k nodes down) >= p)");
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) throw bad("no ':'");
  const std::string ks = text.substr(0, colon), ps = text.substr(colon + 1);
  if (ks.empty() || ks.size() > 9 || ks.find_first_not_of("0123456789") != std::string::npos)
    throw bad("k must be a positive whole number of failed nodes");
  MinRecovery m;
  m.k = std::atoi(ks.c_str());
  if (m.k < 1) throw bad("k must be at least 1");
  char* end = nullptr;
  m.p = std::strtod(ps.c_str(), &end);
  if (ps.empty() || end != ps.c_str() + ps.size() || !std::isfinite(m.p) || m.p < 0 || m.p > 1)
    throw bad("p must be a probability from 0 to 1");
  return m;
}

MinRecoveryChoice smallest_recovery_weight(const MinRecovery& target, const std::function<double(double)>& achieved) {
  MinRecoveryChoice c;
  auto meets = [&](double w, double& got) {
    got = achieved(w);
    c.evaluations++;
    return got >= target.p;
  };
  double got = 0;
  if (meets(0, got)) {
    c.weight = 0, c.achieved = got;
    return c;
  }
  const double at_zero = got;
  if (!meets(1, got))
    throw UsageError("--min-recovery " + std::to_string(target.k) + ":" + number(target.p) +
                     " is not reachable under this fault tolerance: P(" + std::to_string(target.k) +
                     " nodes down) is " + number(at_zero) + " at --recovery-weight 0 and " + number(got) +
                     " at 1 (the most recoverable placement); raise --survive-node-failures or lower p");
  double lo = 0, hi = 1, at_hi = got;
  for (int i = 0; i < 7; ++i) {
    const double mid = (lo + hi) / 2;
    if (meets(mid, got)) {
      hi = mid, at_hi = got;
    } else {
      lo = mid;
    }
  }
  c.weight = hi, c.achieved = at_hi;
  return c;
}

}  // namespace ucpkit::placement
