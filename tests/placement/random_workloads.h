// The randomized workloads of the balanced-ft acceptance tests (skewed, uniform, two dominant
// experts; clusters 2-64 nodes; f = 1..3; two layers each), generated in one fixed order so every test
// that uses them sees the same layers; and a wider set (also Zipf 0.6-1.5 and log-normal loads,
// clusters 2-128 nodes, other seeds) for the bound test.
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <random>
#include <vector>

#include "placement/balance.h"
#include "placement/cluster.h"
#include "placement/loads.h"

namespace placement_test {

enum class Shape { Skewed, Uniform, Dominant, Zipf, LogNormal };

inline const char* shape_name(Shape s) {
  switch (s) {
    case Shape::Skewed: return "skewed";
    case Shape::Uniform: return "uniform";
    case Shape::Dominant: return "dominant";
    case Shape::Zipf: return "zipf";
    default: return "lognormal";
  }
}

inline ucpkit::placement::LoadMatrix random_loads(int layers, int experts, Shape shape, std::mt19937& rng) {
  ucpkit::placement::LoadMatrix w;
  w.layers = layers;
  w.experts = experts;
  std::lognormal_distribution<double> skew(8.0, 1.5);
  std::uniform_real_distribution<double> uni(900, 1100);
  if (shape == Shape::Zipf || shape == Shape::LogNormal) {
    // Zipf: the e-th most loaded expert carries 1e5 / e^s, s in [0.6, 1.5] per layer, experts in a
    // random order; log-normal: exp(N(6, sigma)), sigma in [0.5, 1.5] per layer.
    std::uniform_real_distribution<double> u(0, 1);
    for (int l = 0; l < layers; ++l) {
      const double s = 0.6 + 0.9 * u(rng);
      std::lognormal_distribution<double> ln(6.0, 0.5 + u(rng));
      std::vector<double> row(experts);
      for (int e = 0; e < experts; ++e) row[e] = shape == Shape::Zipf ? 1e5 / std::pow(e + 1.0, s) : ln(rng);
      std::shuffle(row.begin(), row.end(), rng);
      for (double v : row) w.values.push_back(std::floor(v) + 1);
    }
    return w;
  }
  for (int l = 0; l < layers; ++l)
    for (int e = 0; e < experts; ++e) {
      double v = shape == Shape::Skewed ? skew(rng) : uni(rng);
      if (shape == Shape::Dominant) v = e < 2 ? 50000.0 * (e + 1) : uni(rng) / 10;  // a few dominant experts
      w.values.push_back(std::floor(v));
    }
  return w;
}

struct RandomCase {
  ucpkit::placement::Cluster cluster;
  Shape shape;
  int f;
  ucpkit::placement::LoadMatrix loads;
};

// 10 clusters from 2 x 4 x 2 to 64 x 8 x 4, 3 shapes, f = 1..min(3, nodes): 84 cases of 2 layers.
inline void for_each_random_case(const std::function<void(const RandomCase&)>& visit) {
  std::mt19937 rng(7);
  struct Shape3 {
    int nodes, gpus, slots;
  };
  const Shape3 clusters[] = {{2, 4, 2}, {3, 2, 3}, {4, 1, 6}, {4, 4, 4}, {8, 4, 4}, {8, 2, 6},
                             {16, 2, 4}, {32, 4, 2}, {64, 2, 2}, {64, 8, 4}};
  for (const auto& c : clusters)
    for (Shape shape : {Shape::Skewed, Shape::Uniform, Shape::Dominant})
      for (int f = 1; f <= std::min(3, c.nodes); ++f) {
        ucpkit::placement::Cluster cl{c.nodes, c.gpus, c.slots};
        // Experts: between a quarter and a half of the slots, at least f replicas each must fit.
        int E = std::max(3, cl.slots() / (2 + static_cast<int>(rng() % 3)));
        E = std::min(E, cl.slots() / f);
        E = std::min(E, 256);
        visit({cl, shape, f, random_loads(2, E, shape, rng)});
      }
}

// The wider set: 12 more clusters from 2 x 8 x 2 to 128 x 8 x 4 (S = 2 to 6, the tight S = 2 ones
// included), 5 shapes, f = 1..min(3, nodes), another seed: 175 cases of 2 layers.
inline void for_each_wider_case(const std::function<void(const RandomCase&)>& visit) {
  std::mt19937 rng(3131);
  struct Shape3 {
    int nodes, gpus, slots;
  };
  const Shape3 clusters[] = {{2, 8, 2}, {3, 4, 2}, {5, 2, 4}, {6, 1, 6}, {12, 4, 3}, {16, 1, 4},
                             {24, 2, 2}, {40, 2, 3}, {48, 4, 2}, {96, 2, 2}, {128, 4, 2}, {128, 8, 4}};
  for (const auto& c : clusters)
    for (Shape shape : {Shape::Skewed, Shape::Uniform, Shape::Dominant, Shape::Zipf, Shape::LogNormal})
      for (int f = 1; f <= std::min(3, c.nodes); ++f) {
        ucpkit::placement::Cluster cl{c.nodes, c.gpus, c.slots};
        // Experts: a sixth to a half of the slots (the tight end f * E near the slot count included).
        int E = std::max(3, cl.slots() / (2 + static_cast<int>(rng() % 5)));
        E = std::min(E, cl.slots() / f);
        E = std::min(E, 256);
        visit({cl, shape, f, random_loads(2, E, shape, rng)});
      }
}

// Small random instances for the local-search tests: for every cluster, f = 1..3 and `trials` each,
// E = experts(cluster, f, rng) experts with skewed loads (log-normal 8, 1.5, floored, + 1) and counts
// of f each plus the remaining slots to experts drawn at random.
inline void for_each_small_instance(
    unsigned seed, std::initializer_list<ucpkit::placement::Cluster> clusters, int trials,
    const std::function<int(const ucpkit::placement::Cluster&, int, std::mt19937&)>& experts,
    const std::function<void(const ucpkit::placement::Cluster&, int, const std::vector<double>&, const std::vector<int>&)>&
        visit) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> skew(8.0, 1.5);
  for (const auto& cl : clusters)
    for (int f = 1; f <= 3; ++f)
      for (int trial = 0; trial < trials; ++trial) {
        const int E = experts(cl, f, rng);
        std::vector<double> t(E);
        for (double& x : t) x = std::floor(skew(rng)) + 1;
        std::vector<int> r(E, f);
        for (int k = f * E; k < cl.slots(); ++k) r[rng() % E]++;
        visit(cl, f, t, r);
      }
}

// The most loaded GPU of a placement under equal shares.
inline double most_loaded_gpu(const std::vector<int>& phy2log, const std::vector<double>& t,
                              const ucpkit::placement::Cluster& cl) {
  const auto g = ucpkit::placement::gpu_loads(phy2log, t, cl);
  return *std::max_element(g.begin(), g.end());
}

// One layer of loads as a LoadMatrix.
inline ucpkit::placement::LoadMatrix one_layer(const std::vector<double>& t) {
  ucpkit::placement::LoadMatrix w;
  w.layers = 1;
  w.experts = t.size();
  w.values = t;
  return w;
}

// P(every expert keeps a replica) when k of N nodes fail, by enumerating every k-subset.
inline double layer_recovery(const std::vector<int>& phy2log, const ucpkit::placement::Cluster& cl, int experts, int k) {
  const int N = cl.nodes;
  long long ok = 0, all = 0;
  for (unsigned mask = 0; mask < (1u << N); ++mask) {
    if (__builtin_popcount(mask) != k) continue;
    ++all;
    std::vector<char> alive(experts, 0);
    for (size_t p = 0; p < phy2log.size(); ++p)
      if (!((mask >> (p / cl.slots_per_node())) & 1)) alive[phy2log[p]] = 1;
    ok += std::count(alive.begin(), alive.end(), 1) == experts;
  }
  return static_cast<double>(ok) / static_cast<double>(all);
}

// Distinct nodes of every expert, counted from phy2log.
inline std::vector<int> distinct_nodes(const std::vector<int>& phy2log, const ucpkit::placement::Cluster& cl,
                                       int experts) {
  std::vector<std::vector<char>> on(experts, std::vector<char>(cl.nodes, 0));
  for (size_t p = 0; p < phy2log.size(); ++p) on[phy2log[p]][p / cl.slots_per_node()] = 1;
  std::vector<int> d(experts, 0);
  for (int e = 0; e < experts; ++e) d[e] = static_cast<int>(std::count(on[e].begin(), on[e].end(), 1));
  return d;
}

}  // namespace placement_test
