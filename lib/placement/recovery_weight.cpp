// --recovery-weight (see recovery_weight.h and docs/moe-replace.md, "Balance or recovery").
#include "placement/recovery_weight.h"

#include <algorithm>
#include <set>

#include "placement/balance.h"
#include "placement/balanced_ft.h"
#include "placement/mro.h"
#include "placement/recovery.h"

namespace ucpkit::placement {

double f_failure_recovery(const std::vector<int>& phy2log, const Cluster& cl, int experts, int f) {
  if (f >= cl.nodes) return 0;  // every node failed
  std::vector<std::vector<int>> nodes_of(experts);
  for (size_t p = 0; p < phy2log.size(); ++p) {
    auto& v = nodes_of[phy2log[p]];
    const int n = cl.node_of_slot(static_cast<int>(p));
    if (std::find(v.begin(), v.end(), n) == v.end()) v.push_back(n);
  }
  std::set<std::vector<int>> sets;
  for (auto& v : nodes_of)
    if (static_cast<int>(v.size()) <= f) {
      std::sort(v.begin(), v.end());
      sets.insert(v);
    }
  return 1 - static_cast<double>(sets.size()) / binomial(cl.nodes, f);
}

namespace {

// balanced-ft's placement, recovery_candidates of it, the MRO placement of its counts and lazarus'.
std::vector<std::pair<std::string, std::vector<int>>> all_candidates(const std::vector<double>& t, const Cluster& cl,
                                                                     int f, const std::vector<int>& balanced,
                                                                     const std::vector<int>& lazarus) {
  const int E = static_cast<int>(t.size());
  std::vector<std::pair<std::string, std::vector<int>>> cands = {{"balanced-ft", balanced}};
  auto more = recovery_candidates(balanced, t, cl, f);
  for (size_t i = 0; i < more.size(); ++i) cands.push_back({i < 6 ? "overlap" : "blocked", std::move(more[i])});
  std::vector<int> r(E, 0);
  for (int e : balanced) r[e]++;
  MroOptions mo;
  mo.fault_tolerance = f;
  cands.push_back({"mro", layout_nodes(mro_placement(r, t, cl.nodes, cl.slots_per_node(), mo), t, cl).phy2log});
  cands.push_back({"lazarus", lazarus});
  return cands;
}

double max_load(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl) {
  const auto g = gpu_loads(phy2log, t, cl);
  return *std::max_element(g.begin(), g.end());
}

}  // namespace

std::vector<int> recovery_weighted_layer(const std::vector<double>& t, const Cluster& cl, int f, double w,
                                         const std::vector<int>& balanced, const std::vector<int>& lazarus,
                                         WeightedChoice* choice) {
  const int E = static_cast<int>(t.size());
  std::vector<std::pair<std::string, std::vector<int>>> cands = {{"balanced-ft", balanced}};
  if (w > 0) cands = all_candidates(t, cl, f, balanced, lazarus);
  size_t best = 0;
  double best_score = -1, best_b = 0, best_p = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    const double b = balancedness(cands[i].second, t, cl), p = f_failure_recovery(cands[i].second, cl, E, f);
    const double score = (1 - w) * b + w * p;
    if (score > best_score + 1e-12 || (score > best_score - 1e-12 && b > best_b + 1e-12)) {
      best = i, best_score = score, best_b = b, best_p = p;
    }
  }
  if (choice) *choice = {cands[best].first, best_b, best_p};
  return cands[best].second;
}

std::vector<int> recovery_free_layer(const std::vector<double>& t, const Cluster& cl, int f,
                                     const std::vector<int>& balanced, const std::vector<int>& lazarus,
                                     WeightedChoice* choice) {
  const int E = static_cast<int>(t.size());
  const auto cands = all_candidates(t, cl, f, balanced, lazarus);
  const double cap = max_load(balanced, t, cl);
  size_t best = 0;
  double best_m = cap, best_p = f_failure_recovery(balanced, cl, E, f);
  for (size_t i = 1; i < cands.size(); ++i) {
    const double m = max_load(cands[i].second, t, cl);
    if (m > cap) continue;  // exactly: no candidate less balanced than the default
    const double p = f_failure_recovery(cands[i].second, cl, E, f);
    if (p > best_p + 1e-12 || (p > best_p - 1e-12 && m < best_m)) best = i, best_p = p, best_m = m;
  }
  if (choice) *choice = {cands[best].first, balancedness(cands[best].second, t, cl), best_p};
  return cands[best].second;
}

}  // namespace ucpkit::placement
