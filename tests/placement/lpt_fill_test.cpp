// lpt_fill (lib/placement/lpt_fill.h) against a plain scan of every GPU per replica: the batched
// levels and the tournament trees must give the slots this scan gives, for every node rule.
#include "placement/lpt_fill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

namespace ucpkit::placement {
namespace lpt_fill_test {
namespace {

std::vector<int> scan_fill(std::vector<int> phy2log, const std::vector<int>& r, const std::vector<double>& t,
                           const Cluster& cl, NodeRule rule, const std::vector<char>& skip) {
  const int E = static_cast<int>(r.size()), N = cl.nodes, S = cl.slots_per_gpu;
  std::vector<double> load(cl.gpus(), 0.0);
  std::vector<int> used(cl.gpus(), 0);
  for (int p = 0; p < cl.slots(); ++p)
    if (phy2log[p] >= 0) load[p / S] += t[phy2log[p]] / r[phy2log[p]], used[p / S]++;
  std::vector<int> order;
  for (int e = 0; e < E; ++e)
    if (!skip[e] && r[e] > 0) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t[a] / r[a] > t[b] / r[b]; });
  for (int e : order) {
    std::vector<int> here(N, 0);
    int distinct = 0;
    for (int i = 0; i < r[e]; ++i) {
      const int level = rule == NodeRule::levels ? i / N : distinct == N ? std::numeric_limits<int>::max() : 0;
      int any = -1, eligible = -1;
      for (int g = 0; g < cl.gpus(); ++g) {
        if (used[g] == S) continue;
        if (any < 0 || load[g] < load[any]) any = g;
        const bool ok = rule == NodeRule::any || here[cl.node_of_gpu(g)] <= level;
        if (ok && (eligible < 0 || load[g] < load[eligible])) eligible = g;
      }
      const int g = eligible >= 0 ? eligible : any;
      int slot = g * S;
      while (phy2log[slot] >= 0) ++slot;
      phy2log[slot] = e;
      load[g] += t[e] / r[e];
      used[g]++;
      if (here[cl.node_of_gpu(g)]++ == 0) distinct++;
    }
  }
  return phy2log;
}

TEST(LptFill, SameSlotsAsAScanOfEveryGpu) {
  std::mt19937 rng(7);
  int cases = 0, batched = 0;
  for (int it = 0; it < 6000; ++it) {
    Cluster cl{1 + static_cast<int>(rng() % (it % 2 ? 40 : 5)), 1 + static_cast<int>(rng() % 4),
               1 + static_cast<int>(rng() % 6)};
    const int E = 1 + static_cast<int>(rng() % std::min(60, cl.slots()));
    std::vector<int> r(E, 1);
    for (int i = E; i < cl.slots(); ++i) r[rng() % E]++;
    std::vector<double> t(E);
    for (auto& x : t) x = static_cast<double>(rng() % (it % 3 == 0 ? 5 : 1000));  // ties when 5
    std::vector<int> pre(cl.slots(), -1);
    std::vector<char> skip(E, 0);
    if (it % 4 == 0)  // some experts already placed by the caller, at random
      for (int e = 0; e < E; e += 3) {
        skip[e] = 1;
        for (int k = r[e], pass = 0; k > 0; ++pass)
          for (int p = 0; p < cl.slots() && k > 0; ++p)
            if (pre[p] < 0 && (pass > 0 || rng() % 3 == 0)) pre[p] = e, --k;
      }
    for (NodeRule rule : {NodeRule::any, NodeRule::levels, NodeRule::new_nodes_first}) {
      ASSERT_EQ(lpt_fill(pre, r, t, cl, rule, skip), scan_fill(pre, r, t, cl, rule, skip))
          << "case " << it << " rule " << static_cast<int>(rule) << " on " << cl.nodes << "x" << cl.gpus_per_node << "x"
          << cl.slots_per_gpu;
      ++cases;
    }
    batched += *std::max_element(r.begin(), r.end()) < cl.nodes;
  }
  EXPECT_EQ(cases, 18000);
  EXPECT_GT(batched, 1000);  // many cases take the batched path (fewer replicas than nodes)
}

// lpt_pack_below: empty exactly when lpt_pack's most loaded GPU is above the limit, else lpt_pack's
// slots (limits at, just below and just above that maximum, and far from it).
TEST(LptFill, PackBelowALimitIsEmptyExactlyWhenTheFullPackingExceedsIt) {
  std::mt19937 rng(11);
  int empty = 0, whole = 0;
  for (int it = 0; it < 1500; ++it) {
    Cluster cl{1 + static_cast<int>(rng() % 30), 1 + static_cast<int>(rng() % 4), 1 + static_cast<int>(rng() % 5)};
    const int E = 1 + static_cast<int>(rng() % std::min(50, cl.slots()));
    std::vector<int> r(E, 1);
    for (int i = E; i < cl.slots(); ++i) r[rng() % E]++;
    std::vector<double> t(E);
    for (auto& x : t) x = static_cast<double>(rng() % (it % 3 == 0 ? 5 : 1000));
    for (bool spread : {false, true}) {
      const auto full = lpt_pack(r, t, cl, spread);
      std::vector<double> load(cl.gpus(), 0.0);
      for (int p = 0; p < cl.slots(); ++p) load[cl.gpu_of_slot(p)] += t[full[p]] / r[full[p]];
      const double mx = *std::max_element(load.begin(), load.end());
      for (double limit : {mx, std::nextafter(mx, 0.0), std::nextafter(mx, 1e300), mx * 0.5, mx * 2 + 1}) {
        const auto below = lpt_pack_below(r, t, cl, spread, limit);
        if (mx > limit) {
          EXPECT_TRUE(below.empty()) << "case " << it << " limit " << limit << " max " << mx;
          ++empty;
        } else {
          EXPECT_EQ(below, full) << "case " << it << " limit " << limit << " max " << mx;
          ++whole;
        }
      }
    }
  }
  EXPECT_GT(empty, 3000);
  EXPECT_GT(whole, 3000);
}

}  // namespace
}  // namespace lpt_fill_test
}  // namespace ucpkit::placement
