// Recovery probability: exact enumeration against the definition, Monte Carlo against exact.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "placement/planner.h"
#include "placement/recovery.h"

namespace recovery_test {

using namespace ucpkit::placement;

namespace {

// Definition, over all failure sets of size k (bitmask), for up to 20 nodes.
double definition(const ExpertNodeSets& s, int k) {
  const int N = s.nodes();
  long long good = 0, total = 0;
  for (long long mask = 0; mask < (1LL << N); ++mask) {
    if (__builtin_popcountll(mask) != k) continue;
    ++total;
    bool ok = true;
    for (int e = 0; e < s.experts() && ok; ++e) {
      bool alive = false;
      for (int n = 0; n < N; ++n) alive = alive || (s.contains(e, n) && !(mask >> n & 1));
      ok = alive;
    }
    good += ok;
  }
  return static_cast<double>(good) / total;
}

ExpertNodeSets random_sets(std::mt19937& rng, int experts, int nodes, int max_degree) {
  ExpertNodeSets s(experts, nodes);
  for (int e = 0; e < experts; ++e) {
    int d = 1 + static_cast<int>(rng() % max_degree);
    for (int i = 0; i < d; ++i) s.add(e, static_cast<int>(rng() % nodes));
  }
  return s;
}

}  // namespace

// The trials from 30 on give experts at most two nodes: many alone on a node (counted in closed
// form since issue 31) beside pairs that avoid those nodes, and pairs that meet them.
TEST(Recovery, ExactMatchesDefinition) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 80; ++trial) {
    int N = 3 + static_cast<int>(rng() % 12);
    auto s = random_sets(rng, 2 + static_cast<int>(rng() % 20), N, trial < 30 ? 4 : 2);
    RecoveryOptions o;
    o.max_failures = N - 1;
    RecoveryModel model(N, o);
    auto est = model.evaluate(s);
    for (int k = 1; k < N; ++k) {
      EXPECT_TRUE(est[k - 1].exact);
      EXPECT_NEAR(est[k - 1].probability, definition(s, k), 1e-12) << "N=" << N << " k=" << k;
    }
  }
}

TEST(Recovery, MonteCarloAgreesWithExactWithinInterval) {
  std::mt19937 rng(9);
  int checked = 0, outside = 0;
  for (int trial = 0; trial < 12; ++trial) {
    int N = 8 + static_cast<int>(rng() % 10);
    auto s = random_sets(rng, 10 + static_cast<int>(rng() % 30), N, 5);
    RecoveryOptions exact_opt, mc_opt;
    exact_opt.max_failures = mc_opt.max_failures = 5;
    mc_opt.exact_limit = 0;  // force Monte Carlo
    mc_opt.mc_samples = 20000;
    mc_opt.seed = 42 + trial;
    auto ex = RecoveryModel(N, exact_opt).evaluate(s);
    auto mc = RecoveryModel(N, mc_opt).evaluate(s);
    for (size_t i = 0; i < ex.size(); ++i) {
      if (mc[i].exact) continue;  // no expert can be lost: exactly 1 either way
      EXPECT_EQ(mc[i].samples, 20000u);
      double half = (mc[i].ci_high - mc[i].ci_low) / 2;
      bool inside = mc[i].ci_low <= ex[i].probability && ex[i].probability <= mc[i].ci_high;
      outside += !inside;
      // A 95% interval misses now and then; twice its width never should.
      EXPECT_LE(std::abs(mc[i].probability - ex[i].probability), 2 * half + 1e-12) << "N=" << N << " k=" << i + 1;
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
  EXPECT_LE(outside, checked / 10 + 1) << outside << " of " << checked << " outside the 95% interval";
}

TEST(Recovery, PlanMetricsUseMonteCarloBeyondTheLimit) {
  // 40 nodes: C(40,4) = 91390 > limit 50000, so k = 4 is sampled, k <= 3 enumerated.
  LoadMatrix w;
  w.layers = 3;
  w.experts = 40;
  std::mt19937 rng(1);
  for (int i = 0; i < 120; ++i) w.values.push_back(1 + rng() % 100);
  PlacementOptions o;
  o.fault_tolerance = 2;
  o.recovery.exact_limit = 50000;
  o.recovery.mc_samples = 20000;
  Plan p = plan_placement(w, Cluster{40, 2, 2}, "spread", o);
  compute_metrics(p, w, o.recovery);
  ASSERT_EQ(p.metrics.recovery.size(), 4u);
  EXPECT_TRUE(p.metrics.recovery[2].exact);
  EXPECT_DOUBLE_EQ(p.metrics.recovery[0].probability, 1.0);
  // Same plan, exact everywhere: the sampled mean lies in its interval.
  RecoveryOptions ex = o.recovery;
  ex.exact_limit = 1e6;
  Plan q = p;
  compute_metrics(q, w, ex);
  EXPECT_TRUE(q.metrics.recovery[3].exact);
  if (!p.metrics.recovery[3].exact) {
    EXPECT_LE(p.metrics.recovery[3].ci_low, q.metrics.recovery[3].probability);
    EXPECT_GE(p.metrics.recovery[3].ci_high, q.metrics.recovery[3].probability);
  }
}

}  // namespace recovery_test
