// Balance bound under the floor f (see balance_bound.h; the proof is in docs/moe-replace.md).
#include "placement/balance_bound.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>

namespace ucpkit::placement {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The least integer >= x, erring low by a relative 1e-9 so that rounding never overstates a count.
double ceil_low(double x) { return std::ceil(x - 1e-9 * std::max(1.0, std::fabs(x))); }

// (5), one allocation r (every r_e known, sum n): can its replicas be packed with no GPU above T? false
// only where that is proven impossible; true where not (or where the search below gives up).
//  * S = 2: the sorted pairing (largest share with smallest, ...) has the lightest most loaded GPU of
//    all pairings (pair_packing.h; the exchange argument is in docs/moe-replace.md), nodes aside.
//  * any S: the expert e with the largest share sits on GPUs holding k_1 >= ... >= k_b >= 1 of its
//    replicas, sum r_e, each k_g <= r_e - f + 1 (e spans f nodes, so one node holds at most that
//    many); GPU g holds S - k_g other replicas, of experts x != e, at most r_x - f + 1 of x on one GPU
//    (the same argument) and at most r_x of x on all b GPUs. Some k and some such choice of the
//    other replicas must keep every GPU at or below T (depth-first search with a step budget).
class AllocationCheck {
 public:
  AllocationCheck(const std::vector<double>& t, int S, int f, double T, int m) : t_(t), S_(S), f_(f), m_(m), T_(T) {}

  // `order`: the experts in ascending share under r except those in `changed` (whose counts differ
  // from the ones `order` was sorted by); the pairing merges the two without a sort.
  bool packable(const std::vector<int>& r, const std::vector<int>& order, const std::vector<int>& changed) {
    if (S_ != 2) return hot_gpus_fit(r);
    return sorted_pairing_max(r, order, changed) <= T_ * (1 + 1e-12);
  }

  // S = 2: the most loaded GPU of the sorted pairing of r.
  double sorted_pairing_max(const std::vector<int>& r, const std::vector<int>& order, std::vector<int> changed) {
    std::sort(changed.begin(), changed.end(), [&](int a, int b) { return t_[a] * r[b] < t_[b] * r[a]; });
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    groups_.clear();
    size_t c = 0;
    for (int e : order) {
      if (std::find(changed.begin(), changed.end(), e) != changed.end()) continue;
      const double s = t_[e] / r[e];
      for (; c < changed.size() && t_[changed[c]] / r[changed[c]] <= s; ++c)
        groups_.push_back({t_[changed[c]] / r[changed[c]], r[changed[c]]});
      groups_.push_back({s, r[e]});
    }
    for (; c < changed.size(); ++c) groups_.push_back({t_[changed[c]] / r[changed[c]], r[changed[c]]});
    return pairing_max();
  }

 private:
  // groups_: (share, count) in ascending share.
  double pairing_max() {
    double v = 0;
    size_t i = 0, j = groups_.size() - 1;
    while (i < j) {
      const int k = std::min(groups_[i].second, groups_[j].second);
      v = std::max(v, groups_[i].first + groups_[j].first);
      groups_[i].second -= k;
      groups_[j].second -= k;
      if (groups_[i].second == 0) ++i;
      if (groups_[j].second == 0) --j;
    }
    if (i == j && groups_[i].second > 1) v = std::max(v, 2 * groups_[i].first);
    return v;
  }

  bool hot_gpus_fit(const std::vector<int>& r) {
    const int E = static_cast<int>(r.size());
    int e = -1;
    for (int x = 0; x < E; ++x)
      if (r[x] > 0 && (e < 0 || t_[x] * r[e] > t_[e] * r[x])) e = x;
    if (e < 0 || r[e] > 24) return true;  // not examined
    hot_share_ = t_[e] / r[e];
    items_.clear();
    for (int x = 0; x < E; ++x)
      if (x != e && r[x] > 0) items_.push_back({t_[x] / r[x] * (1 - 1e-12), r[x], std::min(S_, r[x] - f_ + 1)});
    std::sort(items_.begin(), items_.end(), [](const Item& a, const Item& b) { return a.share < b.share; });
    steps_ = 0;
    parts_.clear();
    return partitions(r[e], std::min(S_, r[e] - f_ + 1)) || steps_ > kMaxSteps;
  }

  // Every k_1 >= k_2 >= ... >= 1 summing to `left`, parts at most `most`; true when one fits.
  bool partitions(int left, int most) {
    if (left == 0) return fillers_fit();
    if (static_cast<int>(parts_.size()) == m_) return false;  // e has replicas on at most m GPUs
    for (int k = std::min(left, most); k >= 1; --k) {
      if (k * hot_share_ > T_ * (1 + 1e-12)) continue;
      parts_.push_back(k);
      const bool ok = partitions(left - k, k);
      parts_.pop_back();
      if (ok || steps_ > kMaxSteps) return true;
    }
    return false;
  }

  bool fillers_fit() {
    const size_t b = parts_.size();
    cap_.assign(b, 0);
    slots_.assign(b, 0);
    for (size_t g = 0; g < b; ++g) {
      cap_[g] = T_ * (1 + 1e-12) - parts_[g] * hot_share_;
      slots_[g] = S_ - parts_[g];
    }
    left_.assign(items_.size(), 0);
    for (size_t i = 0; i < items_.size(); ++i) left_[i] = items_[i].total;
    here_.assign(b, std::vector<int>(items_.size(), 0));
    first_.assign(b, -1);
    return fill(0, 0, 0);
  }

  // GPU g, its next free slot takes an item at index >= from.
  bool fill(size_t g, size_t from, int placed) {
    if (++steps_ > kMaxSteps) return true;
    if (g == parts_.size()) return true;
    if (placed == slots_[g]) return fill(g + 1, 0, 0);
    // GPUs with the same count of e are interchangeable: their first items nondecreasing.
    size_t start = from;
    if (placed == 0 && g > 0 && parts_[g] == parts_[g - 1]) start = std::max<size_t>(start, first_[g - 1]);
    for (size_t i = start; i < items_.size(); ++i) {
      if (left_[i] == 0 || here_[g][i] >= items_[i].per_gpu) continue;
      const int need = slots_[g] - placed;  // this item and need - 1 more, none smaller than it
      if (items_[i].share * need > cap_[g]) break;
      cap_[g] -= items_[i].share;
      left_[i]--, here_[g][i]++;
      if (placed == 0) first_[g] = static_cast<int>(i);
      const bool ok = fill(g, i, placed + 1);
      cap_[g] += items_[i].share;
      left_[i]++, here_[g][i]--;
      if (ok) return true;
    }
    return false;
  }

  struct Item {
    double share;
    int total, per_gpu;
  };
  static constexpr long long kMaxSteps = 50000;
  const std::vector<double>& t_;
  const int S_, f_, m_;
  const double T_;
  double hot_share_ = 0;
  long long steps_ = 0;
  std::vector<std::pair<double, int>> groups_;
  std::vector<Item> items_;
  std::vector<int> parts_, slots_, left_, first_;
  std::vector<std::vector<int>> here_;  // [GPU][item] replicas of the item on that GPU
  std::vector<double> cap_;
};

// (6), S = 2: a placement with no GPU above T pairs every replica with a partner, the two shares
// summing to at most T. For v >= T / 2, a replica with a share above v has its partner at or below
// T - v (<= v, so no partner serves two of them): #{shares > v} <= #{shares <= T - v}, that is
// sum_e phi_e(r_e) <= 0 with phi_e(r) = r ([t_e / r > v] - [t_e / r <= T - v]). Minimized over every
// allocation r_e >= lo_e with sum n (dynamic programming over the replicas beyond lo, O(E spare) per
// v); a minimum above 0 for some v proves T out of reach. The same for the sum of the two sums of a
// pair v1, v2 (both <= 0 in a placement within T). The v tried: T / 2; up to 24 of the values just
// below a share t_e / r above T / 2 (r from lo_e up), and up to 24 of the values T - s for each
// expert's largest share s <= T / 2 (the points where some phi_e changes); pairs of the first kind,
// as many as a work cap allows. Returns true only where proven.
bool pairing_count_refutes(const std::vector<double>& t, const std::vector<double>& lo, double n, double T) {
  const int E = static_cast<int>(t.size());
  double sum = 0;
  for (double x : lo) sum += x;
  const long long spare = std::llround(n - sum);
  if (spare < 0) return true;
  // Work cap: about 2e7 steps in all (one v or pair of v costs about 4 E (spare + 1)).
  const double per_v = 4.0 * static_cast<double>(E) * static_cast<double>(spare + 1);
  const size_t most_v = static_cast<size_t>(std::min(325.0, 2e7 / per_v));
  if (most_v == 0) return false;  // not examined
  std::vector<double> vs{T / 2};
  std::vector<double> hot, cold;
  for (int e = 0; e < E; ++e)
    for (long long r = static_cast<long long>(lo[e]); r <= static_cast<long long>(lo[e]) + spare && r > 0; ++r) {
      const double sh = t[e] / static_cast<double>(r);
      if (sh > T / 2) {
        hot.push_back(sh * (1 - 1e-12));
      } else {
        if (T - sh >= T / 2) cold.push_back(T - sh);
        break;  // larger r: smaller shares, T - share only grows past the hot ones
      }
    }
  for (auto* list : {&hot, &cold}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
    const size_t k = std::min<size_t>(list->size(), std::min<size_t>(24, (most_v - 1) / 4));
    for (size_t i = 0; i < k; ++i) vs.push_back((*list)[i * list->size() / k]);
  }
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> dp(spare + 1), next(spare + 1);
  // The least sum over allocations of phi for v1 plus phi for v2 (v2 < 0: v1 alone). Both sums are
  // <= 0 for a placement within T, so their total is too.
  // phi_e(lo_e + j) is c (lo_e + j) on runs of j (c = 1, 0, -1 per v; summed for two), so the
  // min-plus step over j is a sliding minimum of dp[i] - c i per run: O(spare) per expert.
  auto least = [&](double v1, double v2) {
    std::fill(dp.begin(), dp.end(), inf);
    dp[0] = 0;
    for (int e = 0; e < E; ++e) {
      std::fill(next.begin(), next.end(), inf);
      // Run starts: where t_e / r drops to v or to T - v (the shares fall as r grows).
      auto first_at_or_below = [&](double x) {
        long long a = 0, b = spare + 1;  // first j with t_e / (lo_e + j) <= x, spare + 1 if none
        while (a < b) {
          const long long mid = (a + b) / 2;
          if (t[e] / (lo[e] + static_cast<double>(mid)) <= x) {
            b = mid;
          } else {
            a = mid + 1;
          }
        }
        return a;
      };
      std::vector<std::pair<long long, int>> cuts{{0, 0}};  // (j, change of c)
      for (const double v : {v1, v2}) {
        if (v < 0) continue;
        cuts[0].second += 1;
        cuts.push_back({first_at_or_below(v), -1});
        cuts.push_back({first_at_or_below(T - v), -1});
      }
      std::sort(cuts.begin() + 1, cuts.end());
      int c = 0;
      for (size_t k = 0; k < cuts.size(); ++k) {
        c += cuts[k].second;
        const long long from = cuts[k].first,
                        to = k + 1 < cuts.size() ? cuts[k + 1].first : spare + 1;  // run [from, to)
        if (from >= to || from > spare) continue;
        std::deque<std::pair<long long, double>> q;
        for (long long x = from; x <= spare; ++x) {  // next[x] over j in [from, to), i = x - j
          const long long i_new = x - from;
          const double val = dp[i_new] - c * static_cast<double>(i_new);
          while (!q.empty() && q.back().second >= val) q.pop_back();
          q.push_back({i_new, val});
          while (q.front().first < x - to + 1) q.pop_front();
          const double best = q.front().second;
          if (best < inf) next[x] = std::min(next[x], best + c * (lo[e] + static_cast<double>(x)));
        }
      }
      dp.swap(next);
    }
    return dp[spare];
  };
  for (const double v : vs)
    if (v >= T / 2 && least(v, -1) > 0.5) return true;  // integers: at least 1
  // Pairs of v among up to 24 of the hot kind (276 pairs), where the work allows. (Pairs among the 8
  // or 16 values nearest to a proof alone do not suffice: on the two-dominant layer below the pair
  // that proves it includes a value weak alone.)
  const size_t k = std::min(
      {hot.size(), static_cast<size_t>(std::sqrt(2.0 * static_cast<double>(most_v - std::min(most_v, vs.size())))),
       size_t{24}});
  for (size_t a = 0; a < k; ++a)
    for (size_t b = a + 1; b < k; ++b) {
      const double v1 = hot[a * hot.size() / k], v2 = hot[b * hot.size() / k];
      if (v1 >= T / 2 && v2 >= T / 2 && least(v1, v2) > 0.5) return true;
    }
  return false;
}

// Steps (1)-(2) of equal_share_feasible: the lower bounds lo, the floor shares (sigma_e, c_e) and phi,
// raised until stable. false = no placement (the bounds exceed n, or phi leaves no room under T).
bool raise_lower_bounds(const std::vector<double>& t, double n, int S, int f, double T, std::vector<double>& lo,
                        std::vector<double>& phi, std::vector<std::pair<double, double>>& floor_shares) {
  const int E = static_cast<int>(t.size());
  // (1) Every count has a lower bound lo_e (first f, and t_e / T: no replica carries more than T).
  // (2) With them, r_e <= c_e = n - sum of the others' lower bounds, so every replica of e carries at
  // least sigma_e = t_e / c_e, and any k replicas together at least phi_k, the sum of the k smallest
  // values of the multiset {sigma_e, c_e times}. A GPU holding a replica of e holds S - 1 others, so
  // t_e / r_e <= T - phi_{S-1}: r_e >= t_e / (T - phi_{S-1}), a new lower bound; repeat until stable
  // (the bounds only grow).
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
  return true;
}

// (4) The r_e replicas of e sit on b GPUs, ceil(r_e / S) <= b <= min(r_e, m); those GPUs carry t_e
// (all of e's tokens, whatever r_e is) plus b S - r_e other replicas, at least phi_{bS - r_e}, and
// at most b T together: some r_e in [lo_e, c_e] and b have t_e + phi_{bS - r_e} <= b T. Checked for
// the 8 experts with the largest possible share, where the ranges are short (a long range is
// skipped: it proves nothing there).
bool expert_spans_possible(const std::vector<double>& t, double n, double m, int S, double T,
                           const std::vector<double>& lo, const std::vector<std::pair<double, double>>& floor_shares) {
  const int E = static_cast<int>(t.size());
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
  return true;
}

// (3) A GPU with j + 1 replicas above theta_j = (T - phi_{S-j-1}) / (j + 1) carries more than T (its
// other S - j - 1 replicas add at least phi_{S-j-1}), so over all m GPUs at most j m replicas have a
// share above theta_j. Let A be the experts above theta_j: sum_{A} r_e <= j m, and an expert
// outside A has r_e >= t_e / theta_j. With sum r_e = n: some A has sum_{A} lo_e <= j m and
// sum_{A} lo_e + sum_{not A} hi_e <= n. The knapsack "largest saving hi_e - lo_e for a cost lo_e
// within j m" is relaxed to its fractional optimum (never smaller).
bool share_thresholds_possible(const std::vector<double>& t, double n, double m, int S, double T,
                               const std::vector<double>& lo, const std::vector<double>& phi) {
  const int E = static_cast<int>(t.size());
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
    std::sort(items.begin(), items.end(),
              [](const auto& a, const auto& b) { return a.first * b.second > b.first * a.second; });
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

// (5) Every allocation left is r_e >= lo_e with sum n: C(E + spare - 1, spare) of them, spare =
// n - sum lo_e. Where they are few, each is checked (AllocationCheck): none packable, none exists.
// least_pairing / allocations as in equal_share_feasible; false = no allocation packs.
bool some_allocation_packs(const std::vector<double>& t, double n, double m, int S, int f, double T,
                           const std::vector<double>& lo, double* least_pairing, double* allocations) {
  const int E = static_cast<int>(t.size());
  double sum = 0;
  for (double x : lo) sum += x;
  const long long spare = std::llround(n - sum);
  if (spare < 0) return false;
  // Work caps: S = 2 costs O(E) per allocation, at most min(1e5, 1.6e7 / E) of them (a
  // 64 x 2 x 2 layer needs 45,760), S > 2 a search of up to 50,000 steps for each of at most 16.
  const double most = S == 2 ? std::min(1e5, 1.6e7 / std::max(1, E)) : 16;
  double count = 1;
  for (long long k = 1; k <= spare && count <= most; ++k)
    count = count * static_cast<double>(E + k - 1) / static_cast<double>(k);
  if (allocations) {  // only how many are left
    *allocations = count;
    return true;
  }
  if (count > most) return true;  // not examined
  std::vector<int> r(E), order(E), changed;
  for (int e = 0; e < E; ++e) r[e] = static_cast<int>(lo[e]);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t[a] * r[b] < t[b] * r[a]; });
  AllocationCheck check(t, S, f, T, static_cast<int>(m));
  bool found = false;
  // With least_pairing (S = 2): every allocation's sorted pairing, the least one kept.
  if (least_pairing) *least_pairing = std::numeric_limits<double>::infinity();
  auto visit = [&](auto&& self, int from, long long left) -> void {
    if (left == 0) {
      if (least_pairing) *least_pairing = std::min(*least_pairing, check.sorted_pairing_max(r, order, changed));
      else found = check.packable(r, order, changed);
      return;
    }
    for (int e = from; e < E && !found; ++e) {
      r[e]++;
      changed.push_back(e);
      self(self, e, left - 1);
      changed.pop_back();
      r[e]--;
    }
  };
  visit(visit, 0, spare);
  return least_pairing ? true : found;
}

// Necessary conditions for a placement meeting f whose most loaded GPU carries at most T (equal
// shares). false = no such placement exists. Steps (1)-(3) as numbered in the proof.
bool equal_share_feasible(const std::vector<double>& t, double n, double m, int S, int f, double mean, double T,
                          bool few_allocations = false, double* least_pairing = nullptr, double* allocations = nullptr,
                          bool pairing_counts = false) {
  if (T < mean) return false;
  const int E = static_cast<int>(t.size());
  std::vector<double> lo(E), phi(S, 0.0);
  std::vector<std::pair<double, double>> floor_shares(E);                       // (sigma_e, c_e)
  if (!raise_lower_bounds(t, n, S, f, T, lo, phi, floor_shares)) return false;  // (1)-(2)
  if (!expert_spans_possible(t, n, m, S, T, lo, floor_shares)) return false;    // (4)
  if (!share_thresholds_possible(t, n, m, S, T, lo, phi)) return false;         // (3)
  if (pairing_counts && S == 2 && pairing_count_refutes(t, lo, n, T)) return false;
  if (!few_allocations) return true;
  return some_allocation_packs(t, n, m, S, f, T, lo, least_pairing, allocations);  // (5)
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
double lower_end(const std::function<bool(double)>& feasible, double mean, double precision = 1e-13) {
  if (feasible(mean)) return mean;
  double lo = mean, hi = 2 * mean;
  for (int i = 0; i < 200 && !feasible(hi); ++i) {
    lo = hi;
    hi *= 2;
  }
  for (int i = 0; i < 200 && hi - lo > precision * hi; ++i) {
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
  b.max_load_lower = lower_end([&](double T) { return equal_share_feasible(t, n, m, S, f, b.mean_load, T); },
                               b.mean_load);
  // Step (5). S = 2: every T <= T_cap needs an allocation with r >= lo(T_cap) (the lo only fall as T
  // grows) whose sorted pairing is <= T, so no T below min(T_cap, the least sorted pairing over
  // those allocations) is reached. T_cap = (1 + d) x the first end for d = 0.1%, 0.15%, ... (x 1.5)
  // while the allocations stay few, until the least pairing is within T_cap (then it is the answer
  // for every larger T_cap too). S > 2: a second bisection from the first end to a relative 1e-7
  // (every end it returns still fails the test).
  const double T0 = b.max_load_lower;
  if (S == 2) {
    const double most = std::min(1e5, 1.6e7 / std::max<size_t>(1, t.size()));
    auto few = [&](double cap) {
      double count = 0;
      return !equal_share_feasible(t, n, m, S, f, b.mean_load, cap, true, nullptr, &count) || count <= most;
    };
    std::vector<double> caps;
    double d = 1e-3;
    for (; d < 1 && few(T0 * (1 + d)); d *= 1.5) caps.push_back(T0 * (1 + d));
    if (d < 1 && d > 1e-3) {  // the largest cap below the first with too many allocations, by bisection
      double lo = T0 * (1 + d / 1.5), hi = T0 * (1 + d);
      for (int i = 0; i < 20; ++i) {
        const double mid = lo + (hi - lo) / 2;
        (few(mid) ? lo : hi) = mid;
      }
      caps.push_back(lo);
    }
    for (const double cap : caps) {
      double least = std::numeric_limits<double>::infinity();
      if (!equal_share_feasible(t, n, m, S, f, b.mean_load, cap, true, &least)) {
        b.max_load_lower = std::max(b.max_load_lower, cap);  // steps 0-4 fail at cap itself
        continue;
      }
      if (least == std::numeric_limits<double>::infinity()) break;  // too many allocations: not examined
      b.max_load_lower = std::max(b.max_load_lower, std::min(cap, least * (1 - 1e-12)));
      if (least <= cap) break;
    }
    // Step (6): the pairing counts, from the end reached so far (every end it returns fails the test).
    b.max_load_lower = lower_end(
        [&](double T) { return equal_share_feasible(t, n, m, S, f, b.mean_load, T, false, nullptr, nullptr, true); },
        b.max_load_lower, 1e-6);
  } else {
    b.max_load_lower = lower_end([&](double T) { return equal_share_feasible(t, n, m, S, f, b.mean_load, T, true); },
                                 T0, 1e-7);
  }
  b.dispatch_max_load_lower = lower_end([&](double D) { return dispatch_feasible(t, n, f, b.mean_load, D); },
                                        b.mean_load);
  b.balancedness = b.mean_load / b.max_load_lower;
  b.dispatch_balancedness = b.mean_load / b.dispatch_max_load_lower;
  return b;
}

}  // namespace ucpkit::placement
