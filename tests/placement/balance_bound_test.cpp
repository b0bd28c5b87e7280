// The balance bound under the floor f (balance_bound.h): checked against the exact optimum over every
// placement meeting f, found here by enumeration on small clusters (the enumeration itself checked
// against a plain enumeration of every slot assignment), and used to hold balanced-ft to
// min(eplb-global, bound) on the randomized workloads of balanced_ft_test.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "placement/balance.h"
#include "placement/balance_bound.h"
#include "placement/dispatch.h"
#include "placement/eplb.h"
#include "placement/planner.h"
#include "exact_optimum.h"
#include "random_workloads.h"

namespace balance_bound_test {

using namespace ucpkit::placement;
using namespace placement_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double max_load(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl) {
  auto g = gpu_loads(phy2log, t, cl);
  return *std::max_element(g.begin(), g.end());
}

// Smallest most loaded GPU over every assignment of experts to slots (E^slots of them) in which
// every expert sits on at least f distinct nodes. Only for a handful of slots.
double naive_optimum(const std::vector<double>& t, const Cluster& cl, int f) {
  const int E = static_cast<int>(t.size()), n = cl.slots();
  std::vector<int> p2l(n, 0);
  double best = kInf;
  long long total = 1;
  for (int i = 0; i < n; ++i) total *= E;
  for (long long code = 0; code < total; ++code) {
    long long c = code;
    for (int i = 0; i < n; ++i, c /= E) p2l[i] = static_cast<int>(c % E);
    auto d = distinct_nodes(p2l, cl, E);
    if (*std::min_element(d.begin(), d.end()) < f) continue;
    best = std::min(best, max_load(p2l, t, cl));
  }
  return best;
}

FtBalanceBound bound_of(const std::vector<double>& t, const Cluster& cl, int f) { return ft_balance_bound(t, cl, f); }

}  // namespace

TEST(BalanceBound, SearchOptimumMatchesPlainEnumeration) {
  // Clusters of at most 8 slots, 2-3 experts (3^8 assignments): the pruned search of the other tests
  // against every assignment.
  std::mt19937 rng(5);
  const Cluster clusters[] = {{2, 1, 2}, {2, 2, 2}, {3, 1, 2}, {4, 1, 1}, {4, 2, 1}, {2, 1, 4}, {4, 1, 2}};
  int checked = 0;
  for (const auto& cl : clusters)
    for (int E = 2; E <= 3; ++E)
      for (int f = 1; f <= std::min(3, cl.nodes); ++f) {
        if (f * E > cl.slots()) continue;
        for (int trial = 0; trial < 3; ++trial) {
          std::vector<double> t(E);
          for (auto& x : t) x = 1 + rng() % (trial == 0 ? 10 : 1000);
          double naive = naive_optimum(t, cl, f), fast = search_optimum(t, cl, f, 1LL << 40);
          EXPECT_NEAR(fast, naive, 1e-9 * naive) << cl.describe() << " E=" << E << " f=" << f;
          ++checked;
        }
      }
  std::printf("search vs plain enumeration: %d instances\n", checked);
  EXPECT_GT(checked, 40);
}

TEST(BalanceBound, FloorExampleIsTight) {
  // 4 nodes x 1 GPU x 1 slot, loads (100, 1), f = 2: every expert has exactly 2 replicas, the hot
  // one's GPUs carry 50, the mean is 25.25: bound 0.505, what every placement meeting f reaches.
  Cluster cl{4, 1, 1};
  auto b = bound_of({100, 1}, cl, 2);
  EXPECT_NEAR(b.mean_load, 25.25, 1e-12);
  EXPECT_NEAR(b.max_load_lower, 50, 1e-6);
  EXPECT_NEAR(b.balancedness, 0.505, 1e-6);
  EXPECT_NEAR(search_optimum({100, 1}, cl, 2, 1LL << 30), 50, 1e-12);
  // Without the floor (f = 1) the hot expert takes 3 slots: 100 / 3 on three GPUs.
  EXPECT_NEAR(bound_of({100, 1}, cl, 1).max_load_lower, 100.0 / 3, 1e-6);
}

TEST(BalanceBound, FillerShareOfTheSlotsBesideTheHotReplica) {
  // 3 nodes x 1 GPU x 2 slots, loads (90, 10, 10), f = 2: 6 slots, every expert exactly 2 replicas
  // (shares 45, 45, 5, 5, 5, 5); a GPU with a share of 45 holds one more replica, at least 5: 50. The
  // largest share alone (45) and the mean (36.67) are below it; step (2) of the bound finds 50.
  Cluster cl{3, 1, 2};
  const std::vector<double> t{90, 10, 10};
  EXPECT_NEAR(search_optimum(t, cl, 2, 1LL << 30), 50, 1e-12);
  EXPECT_NEAR(naive_optimum(t, cl, 2), 50, 1e-12);
  EXPECT_NEAR(bound_of(t, cl, 2).max_load_lower, 50, 1e-6);
}

TEST(BalanceBound, NeverAboveTheExactOptimumOnSmallClusters) {
  // Random small clusters and loads (skewed, uniform, one dominant expert): the bound never promises
  // more than the best placement meeting f; how close it and balanced-ft come is printed.
  std::mt19937 rng(13);
  const Cluster clusters[] = {{2, 1, 2}, {2, 2, 2}, {3, 1, 2}, {2, 1, 3}, {3, 1, 3}, {4, 1, 2},
                              {2, 2, 3}, {4, 2, 2}, {3, 2, 2}, {4, 1, 4}, {2, 4, 2}, {3, 2, 3}};
  int solved = 0, tight = 0, ours_at_opt = 0;
  double worst_bound = 1, worst_ours = 2;
  std::uniform_real_distribution<double> uni(900, 1100);
  std::lognormal_distribution<double> skew(8.0, 1.5);
  for (const auto& cl : clusters)
    for (int shape = 0; shape < 3; ++shape)
      for (int f = 1; f <= std::min(3, cl.nodes); ++f) {
        int E = std::max(2, std::min(cl.slots() / f, cl.slots() / (2 + static_cast<int>(rng() % 2))));
        if (f * E > cl.slots()) continue;
        std::vector<double> t(E);
        for (int e = 0; e < E; ++e) t[e] = std::floor(shape == 0 ? skew(rng) : shape == 1 ? uni(rng) : (e == 0 ? 20000 : uni(rng) / 10));
        double opt = search_optimum(t, cl, f, 20'000'000);
        if (opt == kInf) continue;
        ++solved;
        auto b = bound_of(t, cl, f);
        EXPECT_LE(b.max_load_lower, opt * (1 + 1e-9)) << cl.describe() << " E=" << E << " f=" << f;
        worst_bound = std::max(worst_bound, opt / b.max_load_lower);
        tight += b.max_load_lower >= opt * (1 - 1e-9);
        const LoadMatrix w = one_layer(t);
        PlacementOptions o;
        o.fault_tolerance = f;
        Plan plan = plan_placement(w, cl, "balanced-ft", o);
        double ours = max_load(plan.layers[0].phy2log, t, cl);
        EXPECT_GE(ours, opt * (1 - 1e-12));  // the search is exact: nothing meeting f is lighter
        worst_ours = std::min(worst_ours, opt / ours);
        ours_at_opt += ours <= opt * (1 + 1e-9);
        if (ours > opt * 1.005)
          std::printf("  balanced-ft %.4f of the optimum: %s E=%d f=%d shape %d\n", opt / ours, cl.describe().c_str(), E, f, shape);
      }
  std::printf("small clusters: %d solved exactly; bound = optimum on %d (largest optimum / bound on the most loaded GPU %.4f); balanced-ft at "
              "the optimum on %d (worst balancedness ratio to the optimum %.4f)\n",
              solved, tight, worst_bound, ours_at_opt, worst_ours);
  EXPECT_GT(solved, 40);
}

TEST(BalanceBound, FewAllocationsStepNeverAboveTheExactOptimum) {
  // Step 5 of the bound (every allocation left checked where few are left: S = 2 by the sorted
  // pairing, any S by the hottest expert's GPUs) on clusters where f * E is within a few slots of the
  // slot count, so that few allocations are left: never above the exact optimum (asserted); how
  // often it is the optimum is printed and held.
  std::mt19937 rng(29);
  const Cluster clusters[] = {{2, 2, 2}, {3, 2, 2}, {4, 2, 2}, {5, 2, 2}, {6, 1, 2}, {2, 2, 3}, {3, 1, 4},
                              {4, 1, 4}, {2, 2, 4}, {3, 2, 3}, {4, 1, 3}, {5, 1, 3}};
  std::lognormal_distribution<double> skew(8.0, 1.5);
  std::uniform_real_distribution<double> uni(900, 1100);
  int solved = 0, tight = 0, s2 = 0, s2_tight = 0;
  for (const auto& cl : clusters)
    for (int f = 1; f <= std::min(3, cl.nodes); ++f)
      for (int less = 0; less <= 1; ++less)
        for (int shape = 0; shape < 3; ++shape) {
          const int E = cl.slots() / f - less;
          if (E < 2) continue;
          std::vector<double> t(E);
          for (int e = 0; e < E; ++e)
            t[e] = std::floor(shape == 0 ? skew(rng) : shape == 1 ? uni(rng) : (e == 0 ? 20000 : uni(rng) / 10)) + 1;
          const double opt = search_optimum(t, cl, f, 1'000'000);
          if (opt == kInf) continue;
          ++solved;
          const auto b = bound_of(t, cl, f);
          EXPECT_LE(b.max_load_lower, opt * (1 + 1e-9)) << cl.describe() << " E=" << E << " f=" << f << " shape " << shape;
          const bool is_opt = b.max_load_lower >= opt * (1 - 1e-6);
          tight += is_opt;
          if (cl.slots_per_gpu == 2) s2++, s2_tight += is_opt;
        }
  std::printf("few allocations: %d solved exactly, bound = optimum on %d (S = 2: %d of %d)\n", solved, tight, s2_tight, s2);
  EXPECT_GT(solved, 80);
  EXPECT_GT(tight, solved / 2);
}

TEST(BalanceBound, PairingCountStepNeverAboveTheLightestSortedPairing) {
  // S = 2: every step of the bound, step 6 (the pairing counts) included, reasons about replica
  // counts r_e >= f and shares only, so no bound may exceed the lightest sorted pairing over every
  // such allocation (the best packing with nodes aside), found here by enumerating all of them.
  // Loads with one to three hot experts (step 6's case: few shares above T / 2) and skewed ones.
  std::mt19937 rng(66);
  std::lognormal_distribution<double> skew(6.0, 1.2);
  std::uniform_real_distribution<double> cold(90, 110);
  int checked = 0, equal = 0;
  for (int trial = 0; trial < 160; ++trial) {
    const Cluster cl{2 + static_cast<int>(rng() % 5), 1 + static_cast<int>(rng() % 3), 2};
    const int f = 1 + static_cast<int>(rng() % std::min(3, cl.nodes));
    const int n = cl.slots(), E = std::min(n / f, 3 + static_cast<int>(rng() % 6));
    std::vector<double> t(E);
    const int hot = trial % 4;  // 0: skewed, else that many hot experts
    for (int e = 0; e < E; ++e) t[e] = std::floor(hot == 0 ? skew(rng) : e < hot ? 2000.0 * (e + 1) + rng() % 500 : cold(rng)) + 1;
    // Every allocation r_e >= f with sum n (skipped when there are too many).
    const int spare = n - f * E;
    double count = 1;
    for (int k = 1; k <= spare; ++k) count = count * (E + k - 1) / k;
    if (count > 200000) continue;
    double best = kInf;
    std::vector<int> r(E, f);
    std::function<void(int, int)> visit = [&](int e, int left) {
      if (e == E - 1) {
        r[e] = f + left;
        std::vector<double> s;
        for (int x = 0; x < E; ++x)
          for (int k = 0; k < r[x]; ++k) s.push_back(t[x] / r[x]);
        std::sort(s.begin(), s.end());
        double m = 0;
        for (size_t i = 0; i < s.size() / 2; ++i) m = std::max(m, s[i] + s[s.size() - 1 - i]);
        best = std::min(best, m);
        return;
      }
      for (int x = 0; x <= left; ++x) {
        r[e] = f + x;
        visit(e + 1, left - x);
      }
    };
    visit(0, spare);
    const auto b = bound_of(t, cl, f);
    EXPECT_LE(b.max_load_lower, best * (1 + 1e-9)) << cl.describe() << " f=" << f << " E=" << E;
    equal += b.max_load_lower >= best * (1 - 1e-6);
    ++checked;
  }
  std::printf("pairing counts: %d instances, bound = lightest sorted pairing on %d\n", checked, equal);
  EXPECT_GT(checked, 100);
}

TEST(BalanceBound, ZipfLayerOfTheWiderSetIsWithinHalfAPercentOfItsOptimum) {
  // The wider set's 128 x 4 x 2, 256 Zipf experts, f = 3, layer 0: balanced-ft 0.7576, bound_f
  // 0.7653 (eplb-global 0.8721 gives experts fewer than 3 replicas). Proof here that no placement
  // meeting f balances better than 0.7600, so the rule's target min(eplb-global, bound_f) is not
  // reachable (0.7600 < 0.995 x 0.7653) and balanced-ft is within 0.5% of the optimum.
  // Within T (S = 2) every GPU holds a pair whose shares sum to at most T, so for v >= T / 2 a
  // replica above v has a partner at or below T - v (<= v: no partner serves two): with
  // phi_v(r) = sum_e r_e ([t_e / r_e > v] - [t_e / r_e <= T - v]), phi_v(r) <= 0 for every v, and so
  // sum_v lambda_v phi_v(r) <= 0 for any weights lambda >= 0. Counts: r_e >= 3 (f), sum r_e = 1,024
  // slots, and r_e >= t_e / (T - s_min) with s_min = min_e t_e / (1,024 - 255 x 3) below every share
  // (a replica's partner carries at least s_min). Weights over the values just below every possible
  // share above T / 2 are found by a subgradient method; the least weighted sum over every
  // allocation (exact DP over the replicas beyond the lows) is then above 0: no allocation, so no
  // placement, is within T. Nodes are left out (only a relaxation).
  bool seen = false;
  for_each_wider_case([&](const RandomCase& rc) {
    const Cluster& cl = rc.cluster;
    if (!(cl.nodes == 128 && cl.gpus_per_node == 4 && rc.shape == Shape::Zipf && rc.f == 3)) return;
    seen = true;
    const auto t = rc.loads.layer_vector(0);
    const int E = static_cast<int>(t.size()), f = 3;
    const long long n = cl.slots();
    ASSERT_EQ(E, 256);
    const double mean = std::accumulate(t.begin(), t.end(), 0.0) / cl.gpus(), proven = 0.7600, T = mean / proven;
    double smin = kInf;
    for (double x : t) smin = std::min(smin, x / static_cast<double>(n - static_cast<long long>(E - 1) * f));
    std::vector<long long> lo(E);
    long long spare = n;
    for (int e = 0; e < E; ++e) spare -= lo[e] = std::max<long long>(f, static_cast<long long>(std::ceil(t[e] / (T - smin) - 1e-9)));
    ASSERT_GE(spare, 0);
    std::vector<double> V;
    for (int e = 0; e < E; ++e)
      for (long long r = lo[e]; r <= lo[e] + spare && t[e] / r > T / 2; ++r)
        if (t[e] / r * (1 - 1e-12) >= T / 2) V.push_back(t[e] / r * (1 - 1e-12));
    std::sort(V.begin(), V.end());
    V.erase(std::unique(V.begin(), V.end()), V.end());
    const int J = static_cast<int>(V.size());
    auto phi = [&](int e, long long r, int v) {
      const double s = t[e] / static_cast<double>(r);
      return s > V[v] ? static_cast<double>(r) : s <= T - V[v] ? -static_cast<double>(r) : 0.0;
    };
    std::vector<double> lam(J, 1.0 / J);
    double value = -kInf;
    for (int it = 0; it < 400 && value <= 1e-6; ++it) {
      // Least weighted sum over every allocation, and one allocation reaching it.
      std::vector<std::vector<double>> dp(E + 1, std::vector<double>(spare + 1, kInf));
      std::vector<std::vector<long long>> take(E, std::vector<long long>(spare + 1, 0));
      dp[0][0] = 0;
      for (int e = 0; e < E; ++e) {
        std::vector<double> w(spare + 1, 0.0);
        for (long long j = 0; j <= spare; ++j)
          for (int v = 0; v < J; ++v) w[j] += lam[v] * phi(e, lo[e] + j, v);
        for (long long k = 0; k <= spare; ++k)
          for (long long j = 0; dp[e][k] < kInf && k + j <= spare; ++j)
            if (dp[e][k] + w[j] < dp[e + 1][k + j]) dp[e + 1][k + j] = dp[e][k] + w[j], take[e][k + j] = j;
      }
      value = dp[E][spare];
      // Subgradient step: more weight on the inequalities that allocation breaks.
      std::vector<long long> r(E);
      for (long long k = spare, e = E - 1; e >= 0; --e) k -= (r[e] = lo[e] + take[e][k]) - lo[e];
      std::vector<double> g(J, 0.0);
      double gmax = 1e-300, sum = 0;
      for (int v = 0; v < J; ++v) {
        for (int e = 0; e < E; ++e) g[v] += phi(e, r[e], v);
        gmax = std::max(gmax, std::fabs(g[v]));
      }
      for (int v = 0; v < J; ++v) sum += lam[v] = std::max(0.0, lam[v] + 0.05 / std::sqrt(it + 1.0) * g[v] / gmax);
      for (double& x : lam) x /= sum;
    }
    // Each term is a weight (<= 1) times an integer count below 1,025: rounding errors stay far below 1e-6.
    EXPECT_GT(value, 1e-6) << "no certificate found for T = " << T;
    const double ours = balancedness(plan_placement(rc.loads, cl, "balanced-ft", [] {
                                       PlacementOptions o;
                                       o.fault_tolerance = 3;
                                       return o;
                                     }()).layers[0].phy2log, t, cl);
    const double eplb = balancedness(eplb_rebalance(rc.loads, cl, 1, true)[0].phy2log, t, cl);
    const double target = std::min(eplb, bound_of(t, cl, f).balancedness);
    EXPECT_LT(proven, target * 0.995);  // the rule's target is out of reach under f
    EXPECT_GE(ours, proven * 0.995);    // balanced-ft within 0.5% of the optimum
    std::printf("zipf 128 x 4 x 2 layer 0: %d thresholds, certificate %.4f; balanced-ft %.4f, optimum < %.4f, target %.4f\n",
                J, value, ours, proven, target);
  });
  EXPECT_TRUE(seen);
}

TEST(BalanceBound, BalancedFtReachesMinOfEplbGlobalAndTheBoundOnRandomWorkloads) {
  // The workloads of BalancedFt.MeetsFaultToleranceAndEplbGlobalBalanceOnRandomWorkloads. On every
  // layer balanced-ft (equal shares) is compared with min(eplb-global, bound_f): where the floor does
  // not bind that is eplb-global, where it binds the bound (no placement meeting f does better).
  // With UCPKIT_BOUND_TABLE set, every floor-binding layer of the first set is printed (the table in
  // docs/moe-replace.md). Then the wider set of random_workloads.h (Zipf, log-normal, 2-128 nodes).
  const bool table = std::getenv("UCPKIT_BOUND_TABLE") != nullptr;
  int layers = 0, binding = 0, short_of = 0, searched = 0, at_opt = 0;
  double worst = 2, worst_binding_eplb = 2, worst_dispatch = 2, worst_opt = 2;
  std::vector<double> ratios;
  bool wider = false;  // the table lists the first set only
  std::vector<std::string> wider_short;
  const auto one_case = [&](const RandomCase& rc) {
    const Cluster& cl = rc.cluster;
    const int f = rc.f, E = static_cast<int>(rc.loads.experts);
    PlacementOptions o;
    o.fault_tolerance = f;
    Plan plan = plan_placement(rc.loads, cl, "balanced-ft", o);
    auto ref = eplb_rebalance(rc.loads, cl, 1, true);
    for (size_t l = 0; l < rc.loads.layers; ++l) {
      ++layers;
      const auto t = rc.loads.layer_vector(l);
      const double ours = balancedness(plan.layers[l].phy2log, t, cl);
      const double eplb = balancedness(ref[l].phy2log, t, cl);
      const auto b = bound_of(t, cl, f);
      // The bound holds for balanced-ft's own placement (it meets f).
      EXPECT_LE(ours, b.balancedness * (1 + 1e-9)) << cl.describe() << " f=" << f;
      const double target = std::min(eplb, b.balancedness);
      worst = std::min(worst, ours / target);
      if (ours < target * 0.995) {
        ++short_of;
        if (wider) wider_short.push_back(cl.describe() + " " + shape_name(rc.shape) + " f=" + std::to_string(f) + " layer " + std::to_string(l));
        std::printf("  short: %s E=%d f=%d %s layer %zu: %.4f vs eplb-global %.4f, bound %.4f\n", cl.describe().c_str(), E,
                    f, shape_name(rc.shape), l, ours, eplb, b.balancedness);
      }
      auto cnt = logical_counts(ref[l].phy2log, E);
      if (*std::min_element(cnt.begin(), cnt.end()) >= f) continue;
      ++binding;
      ratios.push_back(ours / b.balancedness);
      worst_binding_eplb = std::min(worst_binding_eplb, ours / eplb);
      // Token dispatch: the same comparison with the dispatch plan of balanced-ft's placement.
      const DispatchPlan dp = dispatch_plan(plan.layers[l].phy2log, t, cl);
      EXPECT_LE(dp.balancedness, b.dispatch_balancedness * (1 + 1e-9));
      worst_dispatch = std::min(worst_dispatch, dp.balancedness / b.dispatch_balancedness);
      double opt = kInf;
      if (cl.slots() <= 24) {
        opt = search_optimum(t, cl, f, 5'000'000);
        if (opt < kInf) {
          ++searched;
          const double best_bal = b.mean_load / opt;
          EXPECT_LE(best_bal, b.balancedness * (1 + 1e-9));
          EXPECT_LE(ours, best_bal * (1 + 1e-9));
          worst_opt = std::min(worst_opt, ours / best_bal);
          at_opt += ours >= best_bal * 0.995;
        }
      }
      if (table && !wider)
        std::printf("| %s | %s | %d | %d | %zu | %.4f | %.4f | %.4f | %s | %.4f | %.4f | %.4f |\n", cl.describe().c_str(),
                    shape_name(rc.shape), E, f, l, ours, eplb, b.balancedness,
                    opt < kInf ? std::to_string(b.mean_load / opt).substr(0, 6).c_str() : "-", ours / b.balancedness,
                    dp.balancedness, b.dispatch_balancedness);
    }
  };
  for_each_random_case(one_case);
  const int first_set = layers, first_short = short_of;
  wider = true;
  for_each_wider_case(one_case);
  std::printf("first set: %d layers, %d short; wider set: %d layers, %d short\n", first_set, first_short,
              layers - first_set, short_of - first_short);
  std::sort(ratios.begin(), ratios.end());
  std::printf("balanced-ft vs min(eplb-global, bound_f): %d layers, %d more than 0.5%% short, worst ratio %.4f; %d "
              "floor-binding layers: balanced-ft / bound_f worst %.4f, median %.4f (vs eplb-global worst %.4f; "
              "%d of them searched exactly: %d within 0.5%% of the optimum, worst ratio %.4f); dispatch plan / dispatch "
              "bound worst %.4f\n",
              layers, short_of, worst, binding, ratios.empty() ? 0 : ratios.front(),
              ratios.empty() ? 0 : (ratios[(ratios.size() - 1) / 2] + ratios[ratios.size() / 2]) / 2, worst_binding_eplb, searched, at_opt, worst_opt,
              worst_dispatch);
  EXPECT_GT(binding, 50);
  EXPECT_GT(searched, 10);
  // The acceptance rule of issue 31: no layer more than 0.5% below min(eplb-global, bound_f). Where
  // eplb-global is above bound_f it is not reachable under f (the bound is proven), and balanced-ft
  // within 0.5% of bound_f is within 0.5% of the optimum.
  EXPECT_EQ(first_short, 0);
  // The wider set (docs/moe-replace.md): two layers are short of min(eplb-global, bound_f), and on
  // both that target is out of reach under f: 5 x 2 x 4 skewed f = 3 layer 0 is optimal (proof by hand
  // in swap_chain_test.cpp: SwapChain.ReachesTheProvenOptimumOnFiveByTwoByFour); on 128 x 4 x 2 Zipf
  // f = 3 layer 0 no placement meeting f exceeds 0.7600 (BalanceBound.ZipfLayerOfTheWiderSetIsWithin
  // HalfAPercentOfItsOptimum), 0.7% below the target, and balanced-ft is within 0.5% of that. Any
  // other short layer fails here.
  for (const auto& w : wider_short)
    EXPECT_TRUE(w == "5 nodes x 2 GPUs x 4 slots skewed f=3 layer 0" || w == "128 nodes x 4 GPUs x 2 slots zipf f=3 layer 0")
        << w;
  EXPECT_GE(worst, 0.985);  // measured 0.9899 (128 x 4 x 2, f = 3, Zipf)
}

}  // namespace balance_bound_test
