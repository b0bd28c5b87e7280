// Token dispatch plan (dispatch.h): GPU loads recomputed here from the shares, and the largest one
// against the optimum from its definition: max over expert sets A of t(A) / |GPUs holding A|,
// enumerated here over every subset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "placement/balance.h"
#include "placement/dispatch.h"
#include "placement/planner.h"

namespace dispatch_test {

using namespace ucpkit::placement;

namespace {

struct Check {
  std::vector<double> gpu;  // recomputed here
  double max = 0;
};

Check recompute(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl,
                const std::vector<double>& share) {
  Check c;
  c.gpu.assign(cl.gpus(), 0.0);
  std::vector<double> sum(t.size(), 0.0);
  for (size_t p = 0; p < phy2log.size(); ++p) {
    EXPECT_GE(share[p], -1e-12) << "slot " << p;
    sum[phy2log[p]] += share[p];
    c.gpu[p / cl.slots_per_gpu] += share[p] * t[phy2log[p]];
  }
  for (size_t e = 0; e < t.size(); ++e) EXPECT_NEAR(sum[e], 1.0, 1e-9) << "shares of expert " << e;
  for (double x : c.gpu) c.max = std::max(c.max, x);
  return c;
}

double brute_force_optimum(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl) {
  const int E = static_cast<int>(t.size());
  std::vector<unsigned long long> gpus_of(E, 0);  // bit mask of GPUs (<= 64 here)
  for (size_t p = 0; p < phy2log.size(); ++p) gpus_of[phy2log[p]] |= 1ull << (p / cl.slots_per_gpu);
  double best = 0;
  for (unsigned a = 1; a < (1u << E); ++a) {
    double load = 0;
    unsigned long long g = 0;
    for (int e = 0; e < E; ++e)
      if (a >> e & 1) load += t[e], g |= gpus_of[e];
    best = std::max(best, load / __builtin_popcountll(g));
  }
  return best;
}

}  // namespace

TEST(Dispatch, HandExample) {
  // 2 GPUs x 2 slots: GPU 0 holds A and B, GPU 1 holds A and C; t = (100, 10, 50).
  // Equal shares: 60 and 100 (balancedness 0.8). Balanced: A gives 70 to GPU 0, 30 to GPU 1.
  Cluster cl{1, 2, 2};
  std::vector<int> phy = {0, 1, 0, 2};
  std::vector<double> t = {100, 10, 50};
  auto d = dispatch_plan(phy, t, cl);
  EXPECT_NEAR(d.share[0], 0.7, 1e-12);
  EXPECT_NEAR(d.share[2], 0.3, 1e-12);
  EXPECT_NEAR(d.share[1], 1.0, 1e-12);
  EXPECT_NEAR(d.gpu_loads[0], 80, 1e-9);
  EXPECT_NEAR(d.gpu_loads[1], 80, 1e-9);
  EXPECT_NEAR(d.balancedness, 1.0, 1e-12);
  auto eq = gpu_loads(phy, t, cl);
  EXPECT_NEAR(std::max(eq[0], eq[1]), 100, 1e-9);
}

TEST(Dispatch, MatchesSubsetOptimumOnRandomPlacements) {
  std::mt19937 rng(15);
  int cases = 0, strictly_better = 0;
  for (int it = 0; it < 300; ++it) {
    Cluster cl{1 + static_cast<int>(rng() % 4), 1 + static_cast<int>(rng() % 3), 1 + static_cast<int>(rng() % 3)};
    const int slots = cl.slots();
    const int E = std::min(slots, 1 + static_cast<int>(rng() % 9));
    std::vector<int> phy(slots);
    for (int p = 0; p < slots; ++p) phy[p] = p < E ? p : static_cast<int>(rng() % E);
    std::shuffle(phy.begin(), phy.end(), rng);
    std::vector<double> t(E);
    std::lognormal_distribution<double> ln(5, 1.5);
    for (auto& x : t) x = (rng() % 7 == 0) ? 0.0 : std::floor(ln(rng));
    auto d = dispatch_plan(phy, t, cl);
    Check c = recompute(phy, t, cl, d.share);
    for (int g = 0; g < cl.gpus(); ++g) ASSERT_NEAR(c.gpu[g], d.gpu_loads[g], 1e-6 * (1 + c.gpu[g]));
    double opt = brute_force_optimum(phy, t, cl);
    ASSERT_NEAR(c.max, opt, 1e-9 * (1 + opt)) << "case " << it;
    auto eq = gpu_loads(phy, t, cl);
    double eq_max = *std::max_element(eq.begin(), eq.end());
    ASSERT_LE(c.max, eq_max * (1 + 1e-12) + 1e-9);
    ++cases;
    strictly_better += c.max < eq_max * (1 - 1e-9);
  }
  EXPECT_EQ(cases, 300);
  EXPECT_GT(strictly_better, 50);  // uneven replicas: equal shares are often not the best split
}

TEST(Dispatch, PlanFileCarriesSharesAndBothBalancedness) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("dispatch_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "loads.json") << "[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]";
  PlanRequest req;
  req.loads_path = (dir / "loads.json").string();
  const Cluster cluster{4, 2, 3};
  req.sizes.nodes = cluster.nodes;
  req.sizes.gpus_per_node = cluster.gpus_per_node;
  req.sizes.slots_per_gpu = cluster.slots_per_gpu;
  req.sizes.survive_node_failures = 1;
  req.dispatch = true;
  PlanOutcome out = make_plan(req);
  auto doc = nlohmann::json::parse(out.plan_file_text());
  ASSERT_TRUE(doc.contains("dispatch"));
  const auto& dj = doc["dispatch"];
  double mean = 0, mx = 0;
  for (size_t l = 0; l < doc["layers"].size(); ++l) {
    auto phy = doc["layers"][l]["phy2log"].get<std::vector<int>>();
    auto share = dj["layers"][l]["share"].get<std::vector<double>>();
    auto loads = nlohmann::json::parse(std::ifstream(dir / "loads.json"))[l].get<std::vector<double>>();
    Check c = recompute(phy, loads, cluster, share);
    double sum = 0;
    for (double x : c.gpu) sum += x;
    mean += sum / cluster.gpus(), mx += c.max;
    EXPECT_NEAR(dj["layers"][l]["balancedness"].get<double>(), sum / cluster.gpus() / c.max, 1e-9);
    EXPECT_NEAR(c.max, brute_force_optimum(phy, loads, cluster), 1e-9 * c.max);
    EXPECT_GE(dj["layers"][l]["balancedness"].get<double>() + 1e-12, doc["layers"][l]["balancedness"].get<double>());
  }
  EXPECT_NEAR(dj["balancedness"].get<double>(), mean / mx, 1e-9);
  EXPECT_NEAR(dj["equal_share_balancedness"].get<double>(), doc["metrics"]["balancedness"].get<double>(), 1e-12);
  EXPECT_TRUE(out.summary.contains("dispatch"));
  EXPECT_NE(out.table.find("dispatch plan: balancedness"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace dispatch_test
