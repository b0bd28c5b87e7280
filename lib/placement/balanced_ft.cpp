// balanced-ft placement (see balanced_ft.h and docs/moe-replace.md).
#include "placement/balanced_ft.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "core/error.h"
#include "placement/cluster_request.h"
#include "placement/algorithm.h"
#include "placement/exact_search.h"
#include "placement/allocation.h"
#include "placement/balance.h"
#include "placement/layer_state.h"
#include "placement/load_bits.h"
#include "placement/lpt_fill.h"
#include "placement/mro.h"
#include "placement/pair_packing.h"
#include "placement/swap_chain.h"
#include "placement/threshold_search.h"
#include "placement/recovery_weight.h"

namespace ucpkit::placement {

namespace {

// The experts that receive the extra replicas, in the greedy's order (largest load per replica
// first, ties to the lower id), for `extra` replicas on top of `floor` each.
std::vector<int> greedy_order(const std::vector<double>& loads, int floor, long long extra) {
  const int E = static_cast<int>(loads.size());
  std::vector<int> r(E, floor), seq;
  seq.reserve(static_cast<size_t>(std::max<long long>(0, extra)));
  // (load per replica, expert), the largest first, ties to the lower id, as one 128-bit number: the
  // bits of the load per replica (never negative; + 0.0 makes a -0.0 +0.0, so equal values have
  // equal bits and the bits order as the values) above the complement of the id. A max-heap of those
  // compares without the branches of comparing doubles.
  using Key = unsigned __int128;
  auto key = [&](int e) {
    return (static_cast<Key>(load_bits(loads[e] / r[e])) << 32) |
           (std::numeric_limits<uint32_t>::max() - static_cast<uint32_t>(e));
  };
  auto id = [](Key k) { return static_cast<int>(std::numeric_limits<uint32_t>::max() - static_cast<uint32_t>(k)); };
  require_load_bits_order(loads, "greedy_order");
  std::vector<Key> heap;
  heap.reserve(E);
  for (int e = 0; e < E; ++e) heap.push_back(key(e));
  std::make_heap(heap.begin(), heap.end());
  const size_t n = heap.size();
  for (long long i = 0; i < extra && E > 0; ++i) {
    // The top's key only falls (t / (r + 1) <= t / r): one sift down instead of a pop and a push.
    const int e = id(heap[0]);
    r[e]++;
    seq.push_back(e);
    const Key k = key(e);
    size_t j = 0;
    for (;;) {
      size_t c = 2 * j + 1;
      if (c >= n) break;
      if (c + 1 < n && heap[c] < heap[c + 1]) ++c;
      if (!(k < heap[c])) break;
      heap[j] = heap[c];
      j = c;
    }
    heap[j] = k;
  }
  return seq;
}

// Counts from a prefix of the greedy order: `floor` each, the first greedy_slots - floor * E
// increments, the rest one at a time to the least loaded experts.
std::vector<int> counts_from(const std::vector<double>& loads, const std::vector<int>& seq, long long slots, int floor,
                             long long greedy_slots, const std::vector<int>* light = nullptr) {
  const int E = static_cast<int>(loads.size());
  std::vector<int> r(E, floor);
  long long left = slots - static_cast<long long>(floor) * E;
  const long long take = std::min<long long>(left,
                                             std::max<long long>(0, greedy_slots - static_cast<long long>(floor) * E));
  for (long long i = 0; i < take; ++i) r[seq[i]]++;
  left -= take;
  if (left > 0) {  // round robin over the experts, least loaded first
    const std::vector<int>& order = light ? *light : ascending_load_order(loads);
    for (int i = 0; i < E; ++i) r[order[i]] += static_cast<int>(left / E + (i < left % E ? 1 : 0));
  }
  return r;
}

// A lower bound on the most loaded GPU of any packing of allocation r (S slots on each of m GPUs, every
// slot filled, equal shares): the mean; the largest share plus the S - 1 smallest; and, for j = 1..S-1,
// the pigeonhole bound (some GPU holds j + 1 of the j m + 1 largest shares, and S - j - 1 more).
// Used to choose where the largest-share rule stops when the floor f binds.
double packing_estimate(const std::vector<int>& r, const std::vector<double>& t, int m, int S) {
  std::vector<std::pair<double, int>> groups;  // (share, count), largest share first
  double total = 0;
  long long n = 0;
  for (size_t e = 0; e < r.size(); ++e) {
    if (r[e] <= 0) continue;
    groups.push_back({t[e] / r[e], r[e]});
    total += t[e];
    n += r[e];
  }
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // sum of the shares of ranks a..b (1 = largest), inclusive
  auto range_sum = [&](long long a, long long b) {
    a = std::max<long long>(a, 1);
    b = std::min(b, n);
    double sum = 0;
    long long first = 1;
    for (const auto& [w, c] : groups) {
      const long long last = first + c - 1, lo = std::max(a, first), hi = std::min(b, last);
      if (lo <= hi) sum += w * static_cast<double>(hi - lo + 1);
      if (last >= b) break;
      first = last + 1;
    }
    return a > b ? 0.0 : sum;
  };
  double est = total / m;
  if (groups.empty()) return est;
  est = std::max(est, groups.front().first + range_sum(n - S + 2, n));
  for (int j = 1; j < S; ++j) {
    const long long top = static_cast<long long>(j) * m + 1;
    if (top > n) break;
    est = std::max(est, range_sum(top - j, top) + range_sum(n - (S - j - 1) + 1, n));
  }
  return est;
}

}  // namespace

std::vector<int> floor_greedy_allocation(const std::vector<double>& loads, long long slots, int floor,
                                         long long greedy_slots) {
  const int E = static_cast<int>(loads.size());
  if (static_cast<long long>(floor) * E > slots)
    throw UsageError(fault_tolerance_option(floor) + " is impossible: " + std::to_string(E) + " experts x " +
                     std::to_string(floor) + " replicas exceed " + std::to_string(slots) + " slots");
  if (greedy_slots < 0 || greedy_slots > slots) greedy_slots = slots;
  auto seq = greedy_order(loads, floor, greedy_slots - static_cast<long long>(floor) * E);
  return counts_from(loads, seq, slots, floor, greedy_slots);
}

namespace {

// Experts with exactly f replicas placed first in blocks of f nodes, `per_node` experts per block
// (block b on nodes b*f .. b*f+f-1, wrapping), each replica on the least loaded GPU of its node with
// room; then everything else by lpt_fill. Fewer blocks = fewer node sets an f-node failure can hit.
std::vector<int> blocked_pack(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, int f,
                              int per_node, bool even_blocks = false) {
  const int E = static_cast<int>(r.size()), S = cl.slots_per_gpu, G = cl.gpus_per_node;
  std::vector<int> phy2log(cl.slots(), -1), used(cl.gpus(), 0);
  std::vector<double> load(cl.gpus(), 0.0);
  std::vector<char> skip(E, 0);
  std::vector<int> fexp;
  for (int e = 0; e < E; ++e)
    if (r[e] == f) fexp.push_back(e);
  std::stable_sort(fexp.begin(), fexp.end(), [&](int a, int b) { return t[a] < t[b]; });
  // Block of every f-replica expert: consecutive in load order, or with `even_blocks` heaviest first
  // to the block with the least load so far (with room), so that the blocks carry similar loads.
  std::vector<int> block(fexp.size());
  for (size_t i = 0; i < fexp.size(); ++i) block[i] = static_cast<int>(i) / per_node;
  if (even_blocks && !fexp.empty()) {
    const int B = static_cast<int>((fexp.size() + per_node - 1) / per_node);
    std::vector<double> bl(B, 0.0);
    std::vector<int> bc(B, 0);
    for (size_t k = fexp.size(); k-- > 0;) {
      int pick = -1;
      for (int b = 0; b < B; ++b)
        if (bc[b] < per_node && (pick < 0 || bl[b] < bl[pick])) pick = b;
      block[k] = pick, bl[pick] += t[fexp[k]], bc[pick]++;
    }
  }
  for (size_t i = 0; i < fexp.size(); ++i) {
    const int e = fexp[i], b = block[i];
    std::vector<int> nodes;
    for (int j = 0; j < f; ++j) nodes.push_back((b * f + j) % cl.nodes);
    std::vector<int> gpus;
    for (int n : nodes) {
      int best = -1;
      for (int g = n * G; g < (n + 1) * G; ++g)
        if (used[g] < S && (best < 0 || load[g] < load[best])) best = g;
      if (best < 0) break;
      gpus.push_back(best);
    }
    if (static_cast<int>(gpus.size()) < f) continue;  // a full node: lpt_fill places this expert
    for (int g : gpus) {
      phy2log[g * S + used[g]++] = e;
      load[g] += t[e] / r[e];
    }
    skip[e] = 1;
  }
  return lpt_fill(std::move(phy2log), r, t, cl, true, skip);
}

std::vector<std::vector<int>> node_contents(const std::vector<int>& phy2log, const Cluster& cl) {
  std::vector<std::vector<int>> nodes(cl.nodes);
  for (size_t p = 0; p < phy2log.size(); ++p) nodes[cl.node_of_slot(static_cast<int>(p))].push_back(phy2log[p]);
  return nodes;
}

// Swap budget for the balance search: enough for every replica to move a few times.
int swap_budget(const Cluster& cl) { return std::max(64, 2 * cl.gpus()); }

double max_of(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl) {
  auto g = gpu_loads(phy2log, t, cl);
  return *std::max_element(g.begin(), g.end());
}

}  // namespace

double eplb_reference_max_load(const std::vector<double>& t, const Cluster& cl) {
  return max_of(lpt_pack(floor_greedy_allocation(t, cl.slots(), 1), t, cl, false), t, cl);
}

namespace {

// EPLB's allocation (floor 1, the largest-share rule over all slots) packed largest share first
// without the node spread, and the greedy order of the floor-f allocation (every candidate is a
// prefix of it). Where EPLB already gives every expert f replicas, the floor-f order is EPLB's
// order without each expert's first f - 1 entries (both list the keys t_e / j in the same global
// order, and EPLB's includes every key with j < f), so one greedy pass serves both.
struct Reference {
  std::vector<int> counts, packed, seq;
  double max = 0;
  bool floor_binds = false;  // EPLB's allocation gives some expert fewer than f replicas
};

Reference eplb_reference(const std::vector<double>& t, const Cluster& cl, int f) {
  const int E = static_cast<int>(t.size());
  const long long slots = cl.slots();
  Reference ref;
  const auto seq1 = greedy_order(t, 1, slots - E);
  ref.counts.assign(E, 1);
  for (int e : seq1) ref.counts[e]++;
  ref.packed = lpt_pack(ref.counts, t, cl, false);
  ref.max = max_of(ref.packed, t, cl);
  ref.floor_binds = *std::min_element(ref.counts.begin(), ref.counts.end()) < f;
  if (ref.floor_binds) {
    ref.seq = greedy_order(t, f, slots - static_cast<long long>(f) * E);
  } else {
    std::vector<int> skipped(E, 0);
    ref.seq.reserve(seq1.size());
    for (int e : seq1)
      if (skipped[e] < f - 1) {
        skipped[e]++;
      } else {
        ref.seq.push_back(e);
      }
  }
  return ref;
}

// One packed allocation: the greedy stopped after `greedy` replicas, packed with or without node spread.
struct Candidate {
  double max;
  long long greedy;
  bool spread;
  std::vector<int> phy2log;
  bool rated = false;     // packed for the floor (add_rated_candidate): refined even when not among the first two
  bool dominant = false;  // from dominant_allocations
  bool paired = false;    // two slots per GPU: the sorted pairing of an improved allocation (pair_packing.h)
};

// The greedy over all slots, and over fewer (half a GPU's worth of slots per GPU less each time, at
// most S + 1 of them, stopping once the full greedy packs as well as EPLB), the rest to the least
// loaded experts; each packed largest share first with replicas spread over nodes (the full greedy
// also without the spread). `seq` is greedy_order over all slots: every candidate is a prefix of it.
std::vector<Candidate> stepped_candidates(const std::vector<double>& t, const Cluster& cl, int f,
                                          const Reference& ref) {
  const std::vector<int>& seq = ref.seq;
  const double reference = ref.max;
  const long long slots = cl.slots(), floor_slots = static_cast<long long>(f) * static_cast<long long>(t.size());
  std::vector<Candidate> cands;
  const long long step = std::max<long long>(1, cl.gpus() / 2);
  for (long long x = slots, k = 0; x >= floor_slots && k <= std::min(cl.slots_per_gpu, 2); x -= step, ++k) {
    auto r = counts_from(t, seq, slots, f, x);
    // Past the first two candidates, only one packing at most as well as the second best so far can
    // be refined (refine_candidates takes the usual candidates lightest first, two of them): its
    // packing stops once a GPU exceeds that, and the candidate keeps an infinite maximum, sorted
    // last.
    std::vector<int> packed;
    if (cands.size() >= 2) {
      std::vector<double> maxes;
      for (const auto& c : cands) maxes.push_back(c.max);
      std::nth_element(maxes.begin(), maxes.begin() + 1, maxes.end());
      packed = lpt_pack_below(r, t, cl, true, maxes[1]);
    } else {
      packed = lpt_pack(r, t, cl, true);
    }
    double m = packed.empty() ? std::numeric_limits<double>::infinity() : max_of(packed, t, cl);
    cands.push_back({m, x, true, std::move(packed)});
    if (cands.front().max <= reference) break;  // the full greedy already packs as well as EPLB
    if (k == 0) {
      packed = r == ref.counts ? ref.packed : lpt_pack(r, t, cl, false);  // EPLB's allocation: already packed
      m = r == ref.counts ? ref.max : max_of(packed, t, cl);
      cands.push_back({m, x, false, std::move(packed)});
    }
  }
  return cands;
}

// Where the floor binds (EPLB's own allocation gives some expert fewer than f replicas), the best
// stopping point of the greedy depends on how the shares pair up on GPUs of S slots (a hot expert
// with more replicas than GPUs doubles up): every stopping point (up to 64, evenly spaced, then 16
// around the best) is rated by packing_estimate and the best rated one that can beat the packed
// candidates is packed and added to `cands`. Nothing when the first candidate is as good as EPLB.
void add_rated_candidate(std::vector<Candidate>& cands, const std::vector<double>& t, const Cluster& cl, int f,
                         const Reference& ref) {
  const std::vector<int>& seq = ref.seq;
  const double reference = ref.max;
  const long long slots = cl.slots(), floor_slots = static_cast<long long>(f) * static_cast<long long>(t.size());
  if (!(cands.front().max > reference && slots > floor_slots)) return;
  if (!ref.floor_binds) return;
  std::vector<std::pair<double, long long>> rated;
  const std::vector<int> light = ascending_load_order(t);
  auto rate = [&](long long x) {
    rated.push_back({packing_estimate(counts_from(t, seq, slots, f, x, &light), t, cl.gpus(), cl.slots_per_gpu), x});
  };
  const long long span = slots - floor_slots, K = std::min<long long>(span, 32);
  for (long long k = 0; k <= K; ++k) rate(floor_slots + span * k / K);
  const long long around = std::min_element(rated.begin(), rated.end())->second, half = span / K;
  for (long long d = -half; d <= half; d += std::max<long long>(1, half / 4))
    if (d != 0 && around + d >= floor_slots && around + d <= slots) rate(around + d);
  std::sort(rated.begin(), rated.end());
  // est is a lower bound for every packing of that allocation: no use packing it when it cannot
  // beat what is already packed, nor when it promises no less than the allocations already packed.
  double packed_best = cands.front().max, packed_est = std::numeric_limits<double>::infinity();
  for (const auto& c : cands) {
    packed_best = std::min(packed_best, c.max);
    packed_est = std::min(
        packed_est, packing_estimate(counts_from(t, seq, slots, f, c.greedy, &light), t, cl.gpus(), cl.slots_per_gpu));
  }
  long long taken = 0, last = -1;
  for (const auto& [est, x] : rated) {
    if (taken == 1 || est >= packed_best || est >= packed_est * (1 - 1e-3)) break;
    if (x == last) continue;
    bool have = false;
    for (const auto& c : cands) have = have || (c.greedy == x && c.spread);
    last = x;
    if (have) continue;
    auto packed = lpt_pack(counts_from(t, seq, slots, f, x), t, cl, true);
    const double mx = max_of(packed, t, cl);
    cands.push_back({mx, x, true, std::move(packed), true});
    ++taken;
  }
}

// Replica counts for dominant experts (hotter than the mean GPU load; at most max(4, E/8) of them):
// each such expert's count in the full greedy `greedy` rounded to a multiple of all GPUs (one replica
// per GPU, or two, ...) or of the GPUs per node, the same rule for every hot expert, the rest of the
// slots by the floor-f greedy over the other experts. The largest-share rule gives a hot expert a
// count such as 7 on 8 GPUs, which leaves one GPU without it and the other seven carrying 1/7 of it
// each (0.909 where one replica per GPU reaches 0.998). Empty when there is none.
std::vector<std::vector<int>> dominant_allocations(const std::vector<double>& t, const Cluster& cl, int f,
                                                   const std::vector<int>& greedy) {
  const int E = static_cast<int>(t.size()), m = cl.gpus(), G = cl.gpus_per_node;
  double total = 0;
  for (double x : t) total += x;
  std::vector<int> hot, cold;
  for (int e = 0; e < E; ++e) (t[e] > total / m ? hot : cold).push_back(e);
  std::vector<std::vector<int>> out;
  // Dominant means few: where most experts carry more than a GPU's mean load (fewer experts than
  // GPUs), the rounding rule is not the point and would only cost time.
  if (hot.empty() || cold.empty() || hot.size() > std::max<size_t>(4, t.size() / 8)) return out;
  std::vector<double> cold_loads;
  for (int e : cold) cold_loads.push_back(t[e]);
  auto round_to = [](int c, int unit, bool up) {
    return std::max(unit, (up ? (c + unit - 1) / unit : c / unit) * unit);
  };
  for (int rule = 0; rule < 5; ++rule) {
    std::vector<int> r(E, 0);
    long long used = 0;
    for (int e : hot) {
      const int c = greedy[e];
      int x = rule == 0   ? m * std::max(1, (c + m / 2) / m)                          // nearest multiple of GPUs
              : rule == 1 ? (c >= m ? round_to(c, m, false) : round_to(c, G, false))  // down
              : rule == 2 ? round_to(c, m, true)                                      // up to all GPUs
              : rule == 3 ? round_to(c, G, false)
                          : round_to(c, G, true);
      r[e] = std::max(x, f);
      used += r[e];
    }
    const long long rest = cl.slots() - used;
    if (rest < static_cast<long long>(f) * static_cast<long long>(cold.size())) continue;
    const auto rc = floor_greedy_allocation(cold_loads, rest, f);
    for (size_t i = 0; i < cold.size(); ++i) r[cold[i]] = rc[i];
    if (r != greedy && std::find(out.begin(), out.end(), r) == out.end()) out.push_back(std::move(r));
  }
  return out;
}

// The layer's placement as it is being chosen: the state and what BalancedFtLayerInfo reports.
struct Chosen {
  std::optional<LayerState> state;
  const char* packing = "";
  long long greedy_slots = 0;
  int node_sets_before = 0, node_sets_after = 0;
  bool searched = false;  // improved by the threshold search
};

// The candidates lightest most loaded GPU first; the first two (and every rated one) are repaired
// for fault tolerance and refined by swaps and rewrites, stopping once one is as balanced as EPLB.
// The best refined one is chosen.
Chosen refine_candidates(std::vector<Candidate> cands, const std::vector<double>& t, const Cluster& cl, int f,
                         double reference) {
  std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) { return a.max < b.max; });
  Chosen best;
  best.greedy_slots = cl.slots();
  for (size_t i = 0, refined = 0; i < cands.size(); ++i) {
    if (best.state && best.state->max_load() <= reference) break;
    if (!cands[i].rated && refined++ >= 2) continue;  // the first two of the usual candidates, as before
    if (cands[i].phy2log.empty()) throw Error("internal: a candidate packed past its limit was refined");
    // A dominant-expert allocation is refined when its packing is near the best refined one.
    if (cands[i].dominant && best.state && cands[i].max >= best.state->max_load() * 1.02) continue;
    LayerState st(cl, t, std::move(cands[i].phy2log));
    repair_fault_tolerance(st, f);
    reduce_max(st, f, swap_budget(cl), true);
    if (!best.state || st.max_load() < best.state->max_load() * (1 - 1e-12)) {
      best.state.emplace(std::move(st));
      best.packing = cands[i].paired     ? "sorted-pairs"
                     : cands[i].dominant ? (cands[i].spread ? "dominant-spread" : "dominant-plain")
                     : cands[i].spread   ? "node-spread"
                                         : "plain";
      best.greedy_slots = cands[i].greedy;
    }
  }
  return best;
}

// Blocked candidates: the experts on exactly f nodes packed first into blocks of f nodes, 2, 4, ...
// times the even share per node; one replaces the chosen placement when its most loaded GPU stays
// within `cap` and fewer node sets remain.
void prefer_blocked_packing(Chosen& best, const std::vector<double>& t, const Cluster& cl, int f, double cap) {
  const int E = static_cast<int>(t.size());
  std::vector<int> r(E, 0);
  for (int e : best.state->phy2log()) r[e]++;
  int F = 0;
  for (int x : r) F += x == f;
  const int even = static_cast<int>((static_cast<long long>(f) * F + cl.nodes - 1) / cl.nodes);
  if (!(F >= 2 && cl.nodes > f && best.node_sets_after > 1)) return;
  for (int q = std::max(1, 2 * even), tries = 0; q <= cl.slots_per_node() && tries < (cl.nodes > 32 ? 1 : 8);
       q *= 2, ++tries) {
    LayerState cand(cl, t, blocked_pack(r, t, cl, f, q));
    repair_fault_tolerance(cand, f);
    reduce_max(cand, f, swap_budget(cl), false);
    if (cand.max_load() > cap) break;  // more per block only gets less balanced
    auto [b2, a2] = overlap_node_sets(cand, f, cap);
    if (a2 < best.node_sets_after) {
      best.state.emplace(std::move(cand));
      best.node_sets_before = b2;
      best.node_sets_after = a2;
      best.packing = "blocked";
    }
  }
}

// Small clusters: the MRO placement of the same replicas as `phy2log` (recovery-optimal where its
// search is exhaustive), when it is as balanced and at least as recoverable for every k and more
// for some; nullopt otherwise.
std::optional<std::vector<int>> better_mro_placement(const std::vector<int>& phy2log, const std::vector<double>& t,
                                                     const Cluster& cl, int f) {
  if (cl.nodes > 12) return std::nullopt;
  const int E = static_cast<int>(t.size());
  MroOptions mo;
  mo.fault_tolerance = f;
  std::vector<int> r(E, 0);
  for (int e : phy2log) r[e]++;
  LayerPlacement mro = layout_nodes(mro_placement(r, t, cl.nodes, cl.slots_per_node(), mo), t, cl);
  if (balancedness(mro.phy2log, t, cl) < balancedness(phy2log, t, cl) - 1e-12) return std::nullopt;
  auto pm = exact_recovery_vector(node_contents(mro.phy2log, cl), E);
  auto po = exact_recovery_vector(node_contents(phy2log, cl), E);
  bool no_worse = true, better = false;
  for (size_t i = 0; i < po.size(); ++i) {
    no_worse = no_worse && pm[i] >= po[i] - 1e-12;
    better = better || pm[i] > po[i] + 1e-12;
  }
  if (no_worse && better) return mro.phy2log;
  return std::nullopt;
}

}  // namespace

std::vector<std::vector<int>> recovery_candidates(const std::vector<int>& phy2log, const std::vector<double>& t,
                                                  const Cluster& cl, int f) {
  std::vector<int> r(t.size(), 0);
  for (int e : phy2log) r[e]++;
  std::vector<std::vector<int>> out;
  // Overlap with slack: the node sets of f-node experts merged while no GPU exceeds the layer's
  // maximum by more than the slack.
  const double slack[] = {0.01, 0.02, 0.05, 0.1, 0.2, 0.5};
  for (double s : slack) {
    LayerState st(cl, t, phy2log);
    overlap_node_sets(st, f, st.max_load() * (1 + s));
    out.push_back(st.phy2log());
  }
  int F = 0;
  for (int x : r) F += x == f;
  const int even = static_cast<int>((static_cast<long long>(f) * F + cl.nodes - 1) / cl.nodes);
  std::vector<int> qs;
  for (int q = 1; q <= cl.slots_per_node(); q *= 2) qs.push_back(q);
  for (int q = even; q <= cl.slots_per_node() && q > 0 && q <= 4 * even; q += (even + 1) / 2) qs.push_back(q);
  for (bool even_blocks : {false, true})
    for (int q : qs) {
      const auto packed = blocked_pack(r, t, cl, f, q, even_blocks);
      LayerState cand(cl, t, packed);
      repair_fault_tolerance(cand, f);
      reduce_max(cand, f, swap_budget(cl), false);
      overlap_node_sets(cand, f, cand.max_load());
      out.push_back(cand.phy2log());
      // The swaps above move replicas across nodes and can undo the blocks; this keeps the nodes'
      // contents and balances only the GPUs inside each node.
      LayerState kept(cl, t, layout_nodes(node_contents(packed, cl), t, cl).phy2log);
      if (repair_fault_tolerance(kept, f).empty()) out.push_back(kept.phy2log());
    }
  return out;
}

void check_balanced_ft_request(const LoadMatrix& loads, const Cluster& cluster, int f) {
  check_fits(loads, cluster);
  if (f > cluster.nodes)
    throw UsageError(fault_tolerance_option(f) + " is impossible with " + std::to_string(cluster.nodes) +
                     " nodes (each expert needs replicas on f distinct nodes)");
}

LayerPlacement balanced_ft_layer(const std::vector<double>& t, const Cluster& cl, int f, BalancedFtLayerInfo* info) {
  const int E = static_cast<int>(t.size());
  const long long slots = cl.slots(), floor_slots = static_cast<long long>(f) * E;
  // Candidate allocations (stepped_candidates, add_rated_candidate); the one with the lightest most
  // loaded GPU is refined by swaps and rewrites; the runner-up too when the first stays above
  // EPLB's packing (refine_candidates).
  floor_greedy_allocation(t, 0 + slots, f, floor_slots);  // throws UsageError when f * E > slots
  const Reference ref = eplb_reference(t, cl, f);
  const auto& seq = ref.seq;  // every candidate is a prefix of it
  const double reference = ref.max;
  std::vector<Candidate> cands = stepped_candidates(t, cl, f, ref);
  add_rated_candidate(cands, t, cl, f, ref);
  // Two slots per GPU: for given counts the sorted pairing is the best packing (nodes aside), so the
  // counts are improved for it directly (pair_packing.h). Above 64 experts 16 steps of 16 x 16 moves,
  // and only up to 512 GPUs: at 1,024 x 8 GPUs even that cost a third more time for 0.1-0.2%.
  if (cl.slots_per_gpu == 2 && (E <= 64 || (E <= 256 && cl.gpus() <= 512))) {
    auto r = improve_pair_allocation(counts_from(t, seq, slots, f, slots), t, f, E <= 64 ? 4 * E + 64 : 16);
    // Up to 64 experts, where the floor binds and the pairing is still above EPLB's balance:
    // restarts from perturbed allocations (64 up to 32 experts, else 16).
    if (ref.floor_binds && E <= 64 && sorted_pairing(r, t).max > reference * (1 + 1e-12))
      r = restart_pair_allocation(std::move(r), t, f, 4 * E + 64, E <= 32 ? 64 : 16);
    auto packed = sorted_pair_layout(r, t, cl);
    const double mx = max_of(packed, t, cl);
    Candidate c{mx, slots, true, std::move(packed), true};
    c.paired = true;
    cands.push_back(std::move(c));
  }
  // Recovery may use the slack down to EPLB's balance (0.2% margin for tie-order differences).
  auto finish = [&](Chosen& c) {
    const double cap = std::max(c.state->max_load(), reference / 1.002);
    std::tie(c.node_sets_before, c.node_sets_after) = overlap_node_sets(*c.state, f, cap);
    prefer_blocked_packing(c, t, cl, f, cap);
  };
  // The dominant-expert allocations and, on small clusters, branch and bound (exact_search.h) make a
  // second choice; it is kept when, after the recovery steps, its most loaded GPU is lighter (or as
  // light with fewer f-node sets) than the usual candidates' (those steps trade balance for recovery
  // differently from each start, so a lighter start alone does not promise a lighter result).
  std::vector<Candidate> more = cands;
  for (auto& r : dominant_allocations(t, cl, f, counts_from(t, seq, slots, f, slots))) {
    for (bool spread : {true, false}) {
      auto packed = lpt_pack(r, t, cl, spread);
      const double mx = max_of(packed, t, cl);
      more.push_back({mx, slots, spread, std::move(packed), true, true});
    }
  }
  const bool dominant = more.size() > cands.size();
  Chosen best = refine_candidates(std::move(cands), t, cl, f, reference);
  std::optional<Chosen> alt;
  if (dominant) {
    alt = refine_candidates(std::move(more), t, cl, f, reference);
    if (alt->packing == best.packing && alt->state->phy2log() == best.state->phy2log()) alt.reset();
  }
  const double incumbent = std::min(best.state->max_load(), alt ? alt->state->max_load() : best.state->max_load());
  if (auto lighter = exact_lighter_placement(t, cl, f, incumbent)) {
    alt.emplace(best);
    alt->state.emplace(cl, t, std::move(*lighter));
    alt->packing = "exact";
  }
  // Small clusters: swap chains off the most loaded GPU (swap_chain.h), then the usual refinement.
  auto chain = [&](Chosen& c) {
    if (cl.slots() > 64) return;
    auto p = swap_chain_improve(c.state->phy2log(), t, cl, f, 4 * cl.gpus());
    if (p == c.state->phy2log()) return;
    c.state.emplace(cl, t, std::move(p));
    reduce_max(*c.state, f, swap_budget(cl), true);
  };
  chain(best);
  if (alt) chain(*alt);
  // Where the floor binds and the placement is still above EPLB's balance: the threshold search
  // (threshold_search.h) toward EPLB's most loaded GPU, then the usual refinement. EPLB's packing
  // itself gives some expert fewer than f replicas; the search keeps f. Its moves per attempt scale
  // with the slots (20,000 to 200,000, a few ms to 0.1 s a layer on 128 x 8 x 4); only up to 8,192
  // slots (at 1,024 x 8 x 4 with the floor binding it cost 4-40 s a layer and rarely helped), and
  // where the floor does not bind (the clusters of bench_placement) it does not run.
  auto search = [&](Chosen& c) {
    if (!ref.floor_binds || slots > 8192 || c.state->max_load() <= reference * (1 + 1e-12)) return;
    ThresholdSearchLimits lim;
    lim.iterations = std::clamp<long long>(25 * slots, 20000, 200000);
    auto p = threshold_search(c.state->phy2log(), t, cl, f, reference, lim);
    if (p == c.state->phy2log()) return;
    c.state.emplace(cl, t, std::move(p));
    reduce_max(*c.state, f, swap_budget(cl), true);
    c.searched = true;
  };
  search(best);
  if (alt) search(*alt);
  finish(best);
  if (alt) {
    finish(*alt);
    const double a = alt->state->max_load(), b = best.state->max_load();
    if (a < b * (1 - 1e-12) || (a <= b * (1 + 1e-12) && alt->node_sets_after < best.node_sets_after))
      best = std::move(*alt);
  }
  LayerPlacement out;
  out.phy2log = best.state->phy2log();
  const auto mro = better_mro_placement(out.phy2log, t, cl, f);
  if (mro) out.phy2log = *mro;
  out.phyrank = ranks_by_appearance(out.phy2log, E);
  if (info) {
    info->packing = best.packing;
    info->greedy_slots = best.greedy_slots;
    info->node_sets_before = best.node_sets_before;
    info->node_sets_after = best.node_sets_after;
    info->mro = mro.has_value();
    info->threshold_search = best.searched;
  }
  return out;
}

namespace {

class BalancedFt : public PlacementAlgorithm {
 public:
  std::string name() const override { return "balanced-ft"; }
  std::string description() const override {
    return "at least f replicas on f distinct nodes, packed for balance, node sets overlapped for recovery";
  }
  PlacementResult place(const LoadMatrix& loads, const Cluster& cluster, const PlacementOptions& opt) const override {
    const int f = opt.fault_tolerance;
    check_balanced_ft_request(loads, cluster, f);
    const double w = opt.recovery_weight;
    if (!(w >= 0 && w <= 1)) throw UsageError("--recovery-weight must be a number from 0 to 1");
    PlacementResult res;
    // --recovery-weight: Lazarus' placement is one of the candidates (recovery_weight.h).
    if (w > 0 && opt.recovery_free) throw UsageError("--recovery-weight and the \"free\" point are exclusive");
    PlacementResult lazarus;
    if (w > 0 || opt.recovery_free) lazarus = make_algorithm("lazarus")->place(loads, cluster, opt);
    auto& d = res.details["balanced_ft"] = nlohmann::json::array();
    for (size_t l = 0; l < loads.layers; ++l) {
      BalancedFtLayerInfo info;
      const auto t = loads.layer_vector(l);
      res.layers.push_back(balanced_ft_layer(t, cluster, f, &info));
      nlohmann::json j = {{"packing", info.packing},
                          {"f_node_sets_before_overlap", info.node_sets_before},
                          {"f_node_sets", info.node_sets_after},
                          {"greedy_slots", info.greedy_slots},
                          {"mro", info.mro}};
      if (info.threshold_search) j["threshold_search"] = true;
      if (w > 0) {
        WeightedChoice choice;
        auto& layer = res.layers.back();
        layer.phy2log = recovery_weighted_layer(t, cluster, f, w, layer.phy2log, lazarus.layers[l].phy2log, &choice);
        layer.phyrank = ranks_by_appearance(layer.phy2log, static_cast<int>(t.size()));
        j["recovery_weight"] = {{"weight", w}, {"source", choice.source}, {"p_f", choice.recovery}};
      } else if (opt.recovery_free) {
        WeightedChoice choice;
        auto& layer = res.layers.back();
        layer.phy2log = recovery_free_layer(t, cluster, f, layer.phy2log, lazarus.layers[l].phy2log, &choice);
        layer.phyrank = ranks_by_appearance(layer.phy2log, static_cast<int>(t.size()));
        j["recovery_free"] = {{"source", choice.source}, {"p_f", choice.recovery}};
      }
      d.push_back(std::move(j));
    }
    return res;
  }
};

const AlgorithmRegistrar kBalancedFtRegistrar("balanced-ft", [] { return std::make_unique<BalancedFt>(); });

}  // namespace
}  // namespace ucpkit::placement
