// Balance bound under the floor f (see balance_bound.h; the proof is in docs/moe-replace.md).
#include "placement/balance_bound.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace ucpkit::placement {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The least integer >= x, erring low by a relative 1e-9 so that rounding never overstates a count.
double ceil_low(double x) { return std::ceil(x - 1e-9 * std::max(1.0, std::fabs(x))); }

// Necessary conditions for a placement meeting f whose most loaded GPU carries at most T (equal
// shares). false = no such placement exists. Steps (1)-(3) as numbered in the proof.
bool equal_share_feasible(const std::vector<double>& t, double n, double m, int S, int f, double mean, double T) {
  if (T < mean) return false;
  const int E = static_cast<int>(t.size());
  // (1) Every count has a lower bound lo_e (first f, and t_e / T: no replica carries more than T).
  // (2) With them, r_e <= c_e = n - sum of the others' lower bounds, so every replica of e carries at
  // least sigma_e = t_e / c_e, and any k replicas together at least phi_k, the sum of the k smallest
  // values of the multiset {sigma_e, c_e times}. A GPU holding a replica of e holds S - 1 others, so
  // t_e / r_e <= T - phi_{S-1}: r_e >= t_e / (T - phi_{S-1}), a new lower bound; repeat until stable
  // (the bounds only grow).
  std::vector<double> lo(E), phi(S, 0.0);
  std::vector<std::pair<double, double>> floor_shares(E);  // (sigma_e, c_e)
  for (int e = 0; e < E; ++e) lo[e] = t[e] > 0 ? std::max<double>(f, ceil_low(t[e] / T)) : f;
  for (int it = 0; it < 64; ++it) {
    double sum = 0;
    for (double x : lo) sum += x;
    if (!(sum <= n)) return false;
    for (int e = 0; e < E; ++e) {
      const double c = n - (sum - lo[e]);
      floor_shares[e] = {t[e] / c * (1 - 1e-12), c};
    }
    std::sort(floor_shares.begin(), floor_shares.end());
    double taken = 0, acc = 0;
    size_t g = 0;
    for (int k = 1; k < S; ++k) {
      while (g < floor_shares.size() && taken >= floor_shares[g].second) {
        taken = 0;
        ++g;
      }
      if (g < floor_shares.size()) {
        acc += floor_shares[g].first;
        taken += 1;
      }
      phi[k] = acc;
    }
    const double cap = T - phi[S - 1];
    if (cap <= 0) return false;
    bool changed = false;
    for (int e = 0; e < E; ++e) {
      const double x = t[e] > 0 ? std::max<double>(f, ceil_low(t[e] / cap)) : f;
      if (x > lo[e]) {
        lo[e] = x;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // (4) The r_e replicas of e sit on b GPUs, ceil(r_e / S) <= b <= min(r_e, m); those GPUs carry t_e
  // (all of e's tokens, whatever r_e is) plus b S - r_e other replicas, at least phi_{bS - r_e}, and
  // at most b T together: some r_e in [lo_e, c_e] and b have t_e + phi_{bS - r_e} <= b T. Checked for
  // the 8 experts with the largest possible share, where the ranges are short (a long range is
  // skipped: it proves nothing there).
  {
    std::vector<double> cum_count, cum_sum;  // over floor_shares, ascending: phi_k by interpolation
    double cc = 0, cs = 0;
    for (const auto& [sig, c] : floor_shares) {
      cum_count.push_back(cc += c);
      cum_sum.push_back(cs += sig * c);
    }
    auto phi_of = [&](double k) {
      if (k <= 0) return 0.0;
      const size_t i = std::lower_bound(cum_count.begin(), cum_count.end(), k) - cum_count.begin();
      if (i >= cum_count.size()) return cum_sum.empty() ? 0.0 : cum_sum.back();
      const double before_count = i ? cum_count[i - 1] : 0, before_sum = i ? cum_sum[i - 1] : 0;
      return before_sum + (k - before_count) * floor_shares[i].first;
    };
    double sum = 0;
    for (double x : lo) sum += x;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return t[a] * lo[b] > t[b] * lo[a]; });
    for (int i = 0; i < std::min(E, 8); ++i) {
      const int e = order[i];
      const double c = n - (sum - lo[e]);
      if (t[e] <= 0 || c - lo[e] > 32) continue;
      bool possible = false;
      for (double r = lo[e]; r <= c && !possible; ++r) {
        const double b_lo = std::ceil(r / S), b_hi = std::min(r, m);
        if (b_hi - b_lo > 64) {
          possible = true;  // not examined
          break;
        }
        for (double b = b_lo; b <= b_hi && !possible; ++b) possible = t[e] + phi_of(b * S - r) <= b * T;
      }
      if (!possible) return false;
    }
  }
  // (3) A GPU with j + 1 replicas above theta_j = (T - phi_{S-j-1}) / (j + 1) carries more than T (its
  // other S - j - 1 replicas add at least phi_{S-j-1}), so over all m GPUs at most j m replicas have a
  // share above theta_j. Let A be the experts above theta_j: sum_{A} r_e <= j m, and an expert
  // outside A has r_e >= t_e / theta_j. With sum r_e = n: some A has sum_{A} lo_e <= j m and
  // sum_{A} lo_e + sum_{not A} hi_e <= n. The knapsack "largest saving hi_e - lo_e for a cost lo_e
  // within j m" is relaxed to its fractional optimum (never smaller).
  std::vector<std::pair<double, double>> items;  // (saving, cost)
  for (int j = 1; j < S; ++j) {
    const double theta = (T - phi[S - j - 1]) / (j + 1);  // > 0: T - phi_{S-1} > 0 above
    double base = 0;
    items.clear();
    for (int e = 0; e < E; ++e) {
      const double hi = t[e] > 0 ? std::max(lo[e], ceil_low(t[e] / theta)) : lo[e];
      base += hi;
      if (hi > lo[e]) items.push_back({hi - lo[e], lo[e]});
    }
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first * b.second > b.first * a.second; });
    double cap = j * m, saved = 0;
    for (const auto& [save, cost] : items) {
      if (cap <= 0) break;
      const double take = std::min(1.0, cap / cost);
      saved += take * save;
      cap -= take * cost;
    }
    if (base - saved > n * (1 + 1e-12)) return false;
  }
  return true;
}

// With any split of the tokens: the GPUs holding e number at most r_e, so one of them carries
// t_e / r_e or more; hence r_e >= t_e / D, r_e >= f, sum r_e = n, and D >= mean.
bool dispatch_feasible(const std::vector<double>& t, double n, int f, double mean, double D) {
  if (D < mean) return false;
  double sum = 0;
  for (double x : t) sum += x <= 0 ? f : std::max<double>(f, ceil_low(x / D));
  return sum <= n;
}

// The largest T in [mean, ...) at which `feasible` still fails (or mean when it holds there): no
// placement meeting f has a most loaded GPU at or below it.
double lower_end(const std::function<bool(double)>& feasible, double mean) {
  if (feasible(mean)) return mean;
  double lo = mean, hi = 2 * mean;
  for (int i = 0; i < 200 && !feasible(hi); ++i) {
    lo = hi;
    hi *= 2;
  }
  for (int i = 0; i < 200 && hi - lo > 1e-13 * hi; ++i) {
    const double mid = lo + (hi - lo) / 2;
    (feasible(mid) ? hi : lo) = mid;
  }
  return lo;
}

}  // namespace

FtBalanceBound ft_balance_bound(const std::vector<double>& t, const Cluster& cl, int f) {
  FtBalanceBound b;
  const double n = cl.slots(), m = cl.gpus();
  const double total = std::accumulate(t.begin(), t.end(), 0.0);
  b.mean_load = total / m;
  if (total <= 0 || f < 1 || static_cast<double>(f) * static_cast<double>(t.size()) > n) return b;
  const int S = cl.slots_per_gpu;
  b.max_load_lower = lower_end([&](double T) { return equal_share_feasible(t, n, m, S, f, b.mean_load, T); }, b.mean_load);
  b.dispatch_max_load_lower = lower_end([&](double D) { return dispatch_feasible(t, n, f, b.mean_load, D); }, b.mean_load);
  b.balancedness = b.mean_load / b.max_load_lower;
  b.dispatch_balancedness = b.mean_load / b.dispatch_max_load_lower;
  return b;
}

}  // namespace ucpkit::placement
