// Recovery probability by enumeration over failure sets and by Monte Carlo.
#include "placement/recovery.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/error.h"

namespace ucpkit::placement {

ExpertNodeSets::ExpertNodeSets(int experts, int nodes)
    : experts_(experts), nodes_(nodes), words_((nodes + 63) / 64), bits_(static_cast<size_t>(experts) * words_, 0),
      degree_(experts, 0) {}

void ExpertNodeSets::add(int e, int node) {
  uint64_t& w = bits_[static_cast<size_t>(e) * words_ + (node >> 6)];
  uint64_t bit = uint64_t{1} << (node & 63);
  if (!(w & bit)) {
    w |= bit;
    degree_[e]++;
  }
}

ExpertNodeSets ExpertNodeSets::from_layer(const std::vector<int>& phy2log, const Cluster& cluster, int experts) {
  ExpertNodeSets s(experts, cluster.nodes);
  for (size_t p = 0; p < phy2log.size(); ++p) s.add(phy2log[p], cluster.node_of_slot(static_cast<int>(p)));
  return s;
}

ExpertNodeSets ExpertNodeSets::from_nodes(const std::vector<std::vector<int>>& node_experts, int experts) {
  ExpertNodeSets s(experts, static_cast<int>(node_experts.size()));
  for (size_t n = 0; n < node_experts.size(); ++n)
    for (int e : node_experts[n]) s.add(e, static_cast<int>(n));
  return s;
}

std::vector<int> ExpertNodeSets::node_list(int e) const {
  std::vector<int> out;
  for (int n = 0; n < nodes_; ++n)
    if (contains(e, n)) out.push_back(n);
  return out;
}

double binomial(int n, int k) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  double r = 1;
  for (int i = 1; i <= k; ++i) r = r * (n - k + i) / i;
  return std::round(r);
}

namespace {

// Experts that k failures can wipe out (at most k distinct nodes), minus those whose node set
// contains another candidate's: losing the superset implies losing the subset.
std::vector<std::vector<int>> minimal_candidates(const ExpertNodeSets& s, int k) {
  std::vector<int> cand;
  for (int e = 0; e < s.experts(); ++e)
    if (s.degree(e) <= k) cand.push_back(e);
  std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return s.degree(a) < s.degree(b); });
  std::vector<int> kept;
  const int W = s.words();
  for (int b : cand) {
    bool dominated = false;
    for (int a : kept) {
      const uint64_t *A = s.bits(a), *B = s.bits(b);
      bool subset = true;
      for (int w = 0; w < W && subset; ++w) subset = (A[w] & ~B[w]) == 0;
      if (subset) {
        dominated = true;
        break;
      }
    }
    if (!dominated) kept.push_back(b);
  }
  std::vector<std::vector<int>> out;
  for (int e : kept) out.push_back(s.node_list(e));
  return out;
}

bool any_lost(const std::vector<std::vector<int>>& cand, size_t upto, const std::vector<char>& failed) {
  for (size_t i = 0; i < upto; ++i) {
    bool lost = true;
    for (int n : cand[i])
      if (!failed[n]) {
        lost = false;
        break;
      }
    if (lost) return true;
  }
  return false;
}

// Calls f() for every m-subset of `pool`, with the chosen nodes marked in `failed`.
template <class F>
void for_each_subset(const std::vector<int>& pool, int m, std::vector<char>& failed, F&& f) {
  const int n = static_cast<int>(pool.size());
  if (m > n) return;
  std::vector<int> idx(m);
  std::iota(idx.begin(), idx.end(), 0);
  for (int i : idx) failed[pool[i]] = 1;
  while (true) {
    f();
    int i = m - 1;
    while (i >= 0 && idx[i] == n - m + i) --i;
    if (i < 0) break;
    for (int j = i; j < m; ++j) failed[pool[idx[j]]] = 0;
    idx[i]++;
    for (int j = i + 1; j < m; ++j) idx[j] = idx[j - 1] + 1;
    for (int j = i; j < m; ++j) failed[pool[idx[j]]] = 1;
  }
  for (int i : idx) failed[pool[i]] = 0;
}

// Number of k-subsets of failed nodes that wipe out some candidate, without singletons (below).
double count_lost_sets_of(const std::vector<std::vector<int>>& cand, int nodes, int k) {
  double by_superset = 0;
  for (const auto& c : cand)
    by_superset += binomial(nodes - static_cast<int>(c.size()), k - static_cast<int>(c.size()));
  std::vector<char> failed(nodes, 0);
  double lost = 0;
  if (by_superset <= binomial(nodes, k)) {
    // Supersets of each candidate's node set, counted once: skip those an earlier candidate owns.
    for (size_t i = 0; i < cand.size(); ++i) {
      std::vector<int> pool;
      std::vector<char> in(nodes, 0);
      for (int n : cand[i]) in[n] = 1;
      for (int n = 0; n < nodes; ++n)
        if (!in[n]) pool.push_back(n);
      for (int n : cand[i]) failed[n] = 1;
      for_each_subset(pool, k - static_cast<int>(cand[i].size()), failed, [&] {
        if (!any_lost(cand, i, failed)) lost += 1;
      });
      for (int n : cand[i]) failed[n] = 0;
    }
  } else {
    std::vector<int> all(nodes);
    std::iota(all.begin(), all.end(), 0);
    for_each_subset(all, k, failed, [&] {
      if (any_lost(cand, cand.size(), failed)) lost += 1;
    });
  }
  return lost;
}

// Number of k-subsets of failed nodes that wipe out some candidate. The nodes U holding an expert
// alone (single-node candidates) are counted in closed form: a subset is lost when it meets U
// (C(N, k) - C(N - |U|, k) of them) or, inside the other nodes V, holds another candidate (those
// meeting U are lost anyway): only V is enumerated.
double count_lost_sets(const std::vector<std::vector<int>>& cand, int nodes, int k) {
  std::vector<char> single(nodes, 0);
  int u = 0;
  for (const auto& c : cand)
    if (c.size() == 1 && !single[c[0]]) single[c[0]] = 1, ++u;
  if (u == 0) return count_lost_sets_of(cand, nodes, k);
  std::vector<int> index(nodes, -1);  // node -> its index among V
  int v = 0;
  for (int n = 0; n < nodes; ++n)
    if (!single[n]) index[n] = v++;
  std::vector<std::vector<int>> inside;
  for (const auto& c : cand) {
    bool meets = false;
    for (int n : c) meets = meets || single[n];
    if (meets) continue;
    std::vector<int> r;
    for (int n : c) r.push_back(index[n]);
    inside.push_back(std::move(r));
  }
  const double lost_inside = inside.empty() ? 0.0 : count_lost_sets_of(inside, v, k);
  return binomial(nodes, k) - (binomial(v, k) - lost_inside);
}

void wilson(RecoveryEstimate& est, double successes, double n) {
  const double z = 1.959963984540054;
  double p = successes / n, z2 = z * z;
  double denom = 1 + z2 / n;
  double center = (p + z2 / (2 * n)) / denom;
  double half = z * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom;
  est.ci_low = std::max(0.0, center - half);
  est.ci_high = std::min(1.0, center + half);
}

}  // namespace

RecoveryModel::RecoveryModel(int nodes, const RecoveryOptions& options)
    : nodes_(nodes), max_k_(std::max(0, std::min(options.max_failures, nodes - 1))), options_(options) {
  if (options.mc_samples == 0) throw UsageError("--mc-samples must be positive");
  samples_.resize(max_k_ + 1);
  std::vector<int> perm(nodes);
  for (int k = 1; k <= max_k_; ++k) {
    if (exact(k)) continue;
    std::mt19937_64 rng(options.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(k));
    std::iota(perm.begin(), perm.end(), 0);
    auto& out = samples_[k];
    out.resize(options.mc_samples * k);
    for (uint64_t s = 0; s < options.mc_samples; ++s) {
      for (int i = 0; i < k; ++i) {  // partial Fisher-Yates: k distinct nodes
        std::uniform_int_distribution<int> pick(i, nodes - 1);
        std::swap(perm[i], perm[pick(rng)]);
        out[s * k + i] = perm[i];
      }
    }
  }
  failed_in_.resize(max_k_ + 1);
  for (int k = 1; k <= max_k_; ++k) {
    if (samples_[k].empty()) continue;
    failed_in_[k].assign(nodes, {});
    for (uint64_t s = 0; s < options.mc_samples; ++s)
      for (int i = 0; i < k; ++i) failed_in_[k][samples_[k][s * k + i]].push_back(static_cast<uint32_t>(s));
  }
  pair_start_.resize(max_k_ + 1);
  pair_samples_.resize(max_k_ + 1);
  pair_keys_.resize(max_k_ + 1);
  const size_t pairs = static_cast<size_t>(nodes) * nodes;
  for (int k = 2; k <= max_k_; ++k) {
    // Beyond 4,096 nodes the per-node lists are walked instead (as fast there, and no index to build).
    if (samples_[k].empty() || pairs > (size_t{1} << 24)) continue;
    auto& start = pair_start_[k];
    auto& data = pair_samples_[k];
    const int* F = samples_[k].data();
    auto each_pair = [&](uint64_t s, auto&& fn) {
      for (int i = 0; i < k; ++i)
        for (int j = i + 1; j < k; ++j) {
          int a = F[s * k + i], b = F[s * k + j];
          if (a > b) std::swap(a, b);
          fn(static_cast<size_t>(a) * nodes + b);
        }
    };
    if (pairs <= (size_t{1} << 20)) {
      // Dense: an offset for every pair.
      start.assign(pairs + 1, 0);
      for (uint64_t s = 0; s < options.mc_samples; ++s) each_pair(s, [&](size_t key) { start[key + 1]++; });
      for (size_t i = 0; i < pairs; ++i) start[i + 1] += start[i];
      data.resize(start[pairs]);
      std::vector<uint32_t> fill(start.begin(), start.end() - 1);
      for (uint64_t s = 0; s < options.mc_samples; ++s)
        each_pair(s, [&](size_t key) { data[fill[key]++] = static_cast<uint32_t>(s); });
    } else {
      // Sparse (many nodes: nodes^2 offsets would cost more than the samples): only the pairs some
      // sample fails, sorted, each with its samples ascending, as in the dense form.
      std::vector<std::pair<uint64_t, uint32_t>> all;
      all.reserve(options.mc_samples * static_cast<size_t>(k) * (k - 1) / 2);
      for (uint64_t s = 0; s < options.mc_samples; ++s)
        each_pair(s, [&](size_t key) { all.push_back({key, static_cast<uint32_t>(s)}); });
      std::sort(all.begin(), all.end());
      auto& keys = pair_keys_[k];
      data.reserve(all.size());
      for (size_t i = 0; i < all.size(); ++i) {
        if (i == 0 || all[i].first != all[i - 1].first) {
          keys.push_back(all[i].first);
          start.push_back(static_cast<uint32_t>(i));
        }
        data.push_back(all[i].second);
      }
      start.push_back(static_cast<uint32_t>(all.size()));
    }
  }
}

std::vector<std::vector<uint32_t>> RecoveryModel::new_survivals() const {
  std::vector<std::vector<uint32_t>> s(max_k_ + 1);
  for (int k = 1; k <= max_k_; ++k)
    if (!exact(k)) s[k].assign(options_.mc_samples, 0);
  return s;
}

RecoveryEstimate RecoveryModel::evaluate_one(const ExpertNodeSets& sets, int k,
                                             std::vector<std::vector<uint32_t>>* survivals) const {
  RecoveryEstimate est;
  est.failed_nodes = k;
  auto cand = minimal_candidates(sets, k);
  if (exact(k) || cand.empty()) {
    double total = binomial(nodes_, k);
    est.probability = cand.empty() ? 1.0 : 1.0 - count_lost_sets(cand, nodes_, k) / total;
    est.ci_low = est.ci_high = est.probability;
    if (!exact(k) && survivals) {
      for (auto& v : (*survivals)[k]) v += 1;
    }
    return est;
  }
  const auto& smp = samples_[k];
  const uint64_t n = options_.mc_samples;
  uint32_t* acc = survivals ? (*survivals)[k].data() : nullptr;
  // A sample loses a candidate set exactly when every node of the set failed in it: walk the
  // samples in which the set's rarest-listed node failed and check the others there (the same
  // outcome per sample as testing every set against every sample).
  std::vector<char> lost(n, 0);
  for (const auto& c : cand) {
    // Samples to walk: those in which the first two nodes of the set both failed (pair index), or
    // for a single node (or without the index) those in which its least often failed node did.
    int pivot = c[0], pivot2 = -1;
    const uint32_t *begin = nullptr, *end = nullptr;
    if (c.size() >= 2 && !pair_start_[k].empty()) {
      pivot2 = c[1];
      const size_t key = static_cast<size_t>(std::min(pivot, pivot2)) * nodes_ + std::max(pivot, pivot2);
      size_t at = key;  // dense: the pair's own offset; sparse: its place among the failed pairs
      const auto& keys = pair_keys_[k];
      if (!keys.empty()) at = static_cast<size_t>(std::lower_bound(keys.begin(), keys.end(), key) - keys.begin());
      if (!keys.empty() && (at == keys.size() || keys[at] != key)) {
        begin = end = nullptr;  // no sample fails both
      } else {
        begin = pair_samples_[k].data() + pair_start_[k][at];
        end = pair_samples_[k].data() + pair_start_[k][at + 1];
      }
    } else {
      for (int m : c)
        if (failed_in_[k][m].size() < failed_in_[k][pivot].size()) pivot = m;
      begin = failed_in_[k][pivot].data();
      end = begin + failed_in_[k][pivot].size();
    }
    for (const uint32_t* it = begin; it != end; ++it) {
      const uint32_t s = *it;
      if (lost[s]) continue;
      const int* F = smp.data() + static_cast<uint64_t>(s) * k;
      bool all = true;
      for (int m : c) {
        if (m == pivot || m == pivot2) continue;
        bool in = false;
        for (int i = 0; i < k && !in; ++i) in = F[i] == m;
        if (!in) {
          all = false;
          break;
        }
      }
      if (all) lost[s] = 1;
    }
  }
  uint64_t ok = 0;
  for (uint64_t s = 0; s < n; ++s) {
    const uint32_t survived = lost[s] ? 0u : 1u;
    ok += survived;
    if (acc) acc[s] += survived;
  }
  est.exact = false;
  est.samples = n;
  est.probability = static_cast<double>(ok) / static_cast<double>(n);
  wilson(est, static_cast<double>(ok), static_cast<double>(n));
  return est;
}

std::vector<RecoveryEstimate> RecoveryModel::evaluate(const ExpertNodeSets& sets,
                                                      std::vector<std::vector<uint32_t>>* survivals) const {
  std::vector<RecoveryEstimate> out;
  for (int k = 1; k <= max_k_; ++k) out.push_back(evaluate_one(sets, k, survivals));
  return out;
}

std::vector<RecoveryEstimate> RecoveryModel::aggregate(const std::vector<std::vector<RecoveryEstimate>>& per_layer,
                                                       const std::vector<std::vector<uint32_t>>& survivals) const {
  std::vector<RecoveryEstimate> out;
  const double L = static_cast<double>(per_layer.size());
  for (int k = 1; k <= max_k_; ++k) {
    RecoveryEstimate est;
    est.failed_nodes = k;
    double sum = 0;
    for (const auto& layer : per_layer) sum += layer[k - 1].probability;
    est.probability = L > 0 ? sum / L : 1.0;
    est.ci_low = est.ci_high = est.probability;
    if (!exact(k) && L > 0) {
      const auto& v = survivals[k];
      const double n = static_cast<double>(v.size());
      double mean = 0, sq = 0;
      for (uint32_t x : v) {
        double y = x / L;
        mean += y;
        sq += y * y;
      }
      mean /= n;
      double var = std::max(0.0, sq / n - mean * mean) * n / std::max(1.0, n - 1);
      double half = 1.959963984540054 * std::sqrt(var / n);
      est.exact = false;
      est.samples = static_cast<uint64_t>(n);
      est.probability = mean;
      est.ci_low = std::max(0.0, mean - half);
      est.ci_high = std::min(1.0, mean + half);
    }
    out.push_back(est);
  }
  return out;
}

}  // namespace ucpkit::placement
