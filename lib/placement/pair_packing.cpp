// Sorted pairing for two slots per GPU (see pair_packing.h).
#include "placement/pair_packing.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace ucpkit::placement {

namespace {

struct Group {
  double share;
  long long count;
};

// The sorted pairing of groups given in ascending share: the smallest remaining share with the
// largest remaining one, group by group.
PairingValue pair_groups(std::vector<Group>& g) {
  PairingValue v;
  if (g.empty()) return v;
  auto add = [&](double s, long long k) {  // the running maximum and the pairs within 1e-12 of it
    if (s > v.max * (1 + 1e-12)) {
      v.max = s;
      v.at_max = k;
    } else if (s >= v.max * (1 - 1e-12)) {
      v.max = std::max(v.max, s);
      v.at_max += k;
    }
  };
  size_t i = 0, j = g.size() - 1;
  while (i < j) {
    const long long k = std::min(g[i].count, g[j].count);
    add(g[i].share + g[j].share, k);
    g[i].count -= k;
    g[j].count -= k;
    if (g[i].count == 0) ++i;
    if (g[j].count == 0) --j;
  }
  if (i == j && g[i].count > 1) add(2 * g[i].share, g[i].count / 2);
  return v;
}

bool better(const PairingValue& a, const PairingValue& b) {
  return a.max < b.max * (1 - 1e-12) || (a.max <= b.max * (1 + 1e-12) && a.at_max < b.at_max);
}

// Experts with replicas in ascending share (ties to the lower id).
std::vector<int> by_share(const std::vector<int>& r, const std::vector<double>& t) {
  std::vector<int> order;
  for (size_t e = 0; e < r.size(); ++e)
    if (r[e] > 0) order.push_back(static_cast<int>(e));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t[a] * r[b] < t[b] * r[a]; });
  return order;
}

}  // namespace

PairingValue sorted_pairing(const std::vector<int>& r, const std::vector<double>& t) {
  std::vector<Group> g;
  for (int e : by_share(r, t)) g.push_back({t[e] / r[e], r[e]});
  return pair_groups(g);
}

std::vector<int> improve_pair_allocation(std::vector<int> r, const std::vector<double>& t, int f, int max_steps) {
  const int E = static_cast<int>(r.size());
  std::vector<int> order = by_share(r, t);
  PairingValue cur = sorted_pairing(r, t);
  std::vector<Group> g;
  g.reserve(E + 2);
  // The groups with a's count one lower and b's one higher, in ascending share: `order` without a
  // and b, the two new shares merged in (O(E) per move instead of a sort).
  auto value_after = [&](int a, int b) {
    const double sa = r[a] > 1 ? t[a] / (r[a] - 1) : 0, sb = t[b] / (r[b] + 1);
    Group ga{sa, r[a] - 1}, gb{sb, r[b] + 1};
    if (gb.share < ga.share) std::swap(ga, gb);
    g.clear();
    int placed = 0;
    auto put = [&](const Group& x) {
      if (x.count > 0) g.push_back(x);
    };
    for (int e : order) {
      if (e == a || e == b) continue;
      const double s = t[e] / r[e];
      if (placed == 0 && ga.share <= s) put(ga), ++placed;
      if (placed == 1 && gb.share <= s) put(gb), ++placed;
      g.push_back({s, r[e]});
    }
    if (placed == 0) put(ga), ++placed;
    if (placed == 1) put(gb);
    return pair_groups(g);
  };
  // Few allocations (r_e >= f, the same sum): every one is tried, the best sorted pairing kept.
  {
    long long spare = -static_cast<long long>(f) * E;
    for (int x : r) spare += x;
    double count = 1;
    for (long long k = 1; k <= spare && count <= 300000; ++k)
      count = count * static_cast<double>(E + k - 1) / static_cast<double>(k);
    if (count <= 300000) {
      std::vector<int> a(E, f), best = r;
      PairingValue best_v = cur;
      auto visit = [&](auto&& self, int e, long long left) -> void {
        if (e == E - 1) {
          a[e] = f + static_cast<int>(left);
          const PairingValue v = sorted_pairing(a, t);
          if (better(v, best_v)) best_v = v, best = a;
          return;
        }
        for (long long x = 0; x <= left; ++x) {
          a[e] = f + static_cast<int>(x);
          self(self, e + 1, left - x);
        }
      };
      if (E > 0) visit(visit, 0, spare);
      return best;
    }
  }
  // Receivers: the experts of the pairs at the maximum first (a lower share there is what lowers
  // it), then the rest; donors: those whose share rises least first. Up to 64 experts every move is
  // tried, above that the first 16 receivers with the first 16 donors.
  std::vector<int> receivers, donors, mark(E, 0);
  for (int step = 0; step < max_steps; ++step) {
    receivers.clear();
    std::fill(mark.begin(), mark.end(), 0);
    {
      const int k = static_cast<int>(order.size());
      std::vector<long long> left(k);
      for (int i = 0; i < k; ++i) left[i] = r[order[i]];
      int i = 0, j = k - 1;
      while (i <= j) {
        const int lo = order[i], hi = order[j];
        const long long c = i == j ? left[i] / 2 : std::min(left[i], left[j]);
        if (c == 0) break;
        if (t[lo] / r[lo] + t[hi] / r[hi] >= cur.max * (1 - 1e-12)) {
          if (!mark[hi]) mark[hi] = 1, receivers.push_back(hi);
          if (!mark[lo]) mark[lo] = 1, receivers.push_back(lo);
        }
        if (i == j) break;
        left[i] -= c, left[j] -= c;
        if (left[i] == 0) ++i;
        if (left[j] == 0) --j;
      }
    }
    for (int e = 0; e < E; ++e)
      if (!mark[e]) receivers.push_back(e);
    donors.clear();
    for (int e = 0; e < E; ++e)
      if (r[e] > f) donors.push_back(e);
    std::sort(donors.begin(), donors.end(), [&](int a, int b) { return t[a] * (r[b] - 1) < t[b] * (r[a] - 1); });
    const size_t few = E <= 64 ? donors.size() : std::min<size_t>(donors.size(), 16);
    const size_t scan = E <= 64 ? receivers.size() : std::min<size_t>(receivers.size(), 16);
    bool moved = false;
    for (size_t ib = 0; ib < scan && !moved; ++ib)
      for (size_t ia = 0; ia < few && !moved; ++ia) {
        const int a = donors[ia], b = receivers[ib];
        if (a == b) continue;
        const PairingValue v = value_after(a, b);
        if (!better(v, cur)) continue;
        r[a]--, r[b]++;
        cur = v;
        order = by_share(r, t);
        moved = true;
      }
    if (!moved) break;
  }
  return r;
}

std::vector<int> restart_pair_allocation(std::vector<int> r, const std::vector<double>& t, int f, int max_steps,
                                         int restarts) {
  const int E = static_cast<int>(r.size());
  if (E < 2) return r;
  auto better = [](const PairingValue& a, const PairingValue& b) {
    return a.max < b.max * (1 - 1e-12) || (a.max <= b.max * (1 + 1e-12) && a.at_max < b.at_max);
  };
  PairingValue best = sorted_pairing(r, t);
  uint64_t state = 0x9A1231ULL;  // splitmix64: the same moves on every platform
  auto next = [&] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return static_cast<int>((z ^ (z >> 31)) % static_cast<uint64_t>(E));
  };
  for (int i = 0; i < restarts; ++i) {
    std::vector<int> x = r;
    for (int k = 0; k < 2 + i % 8; ++k) {
      const int a = next(), b = next();
      if (a != b && x[a] > f) x[a]--, x[b]++;
    }
    x = improve_pair_allocation(std::move(x), t, f, max_steps);
    const PairingValue v = sorted_pairing(x, t);
    if (better(v, best)) {
      best = v;
      r = std::move(x);
    }
  }
  return r;
}

std::vector<int> sorted_pair_layout(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl) {
  std::vector<int> items;  // every replica, ascending share
  for (int e : by_share(r, t))
    for (int k = 0; k < r[e]; ++k) items.push_back(e);
  const int m = cl.gpus(), N = cl.nodes, G = cl.gpus_per_node;
  std::vector<int> phy2log(cl.slots(), -1);
  for (int k = 0; k < m && 2 * k + 1 < static_cast<int>(items.size()); ++k) {
    const int gpu = (k % N) * G + (k / N) % G;
    phy2log[2 * gpu] = items[items.size() - 1 - k];
    phy2log[2 * gpu + 1] = items[k];
  }
  return phy2log;
}

}  // namespace ucpkit::placement
