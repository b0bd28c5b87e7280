// GPU loads and balancedness.
#include "placement/balance.h"

#include <algorithm>
#include <numeric>

namespace ucpkit::placement {

std::vector<double> gpu_loads(const std::vector<int>& phy2log, const std::vector<double>& loads,
                              const Cluster& cluster) {
  std::vector<int> cnt = logical_counts(phy2log, static_cast<int>(loads.size()));
  std::vector<double> g(cluster.gpus(), 0.0);
  for (size_t p = 0; p < phy2log.size(); ++p) {
    int e = phy2log[p];
    g[cluster.gpu_of_slot(static_cast<int>(p))] += loads[e] / cnt[e];
  }
  return g;
}

double balancedness(const std::vector<double>& g) {
  if (g.empty()) return 1.0;
  double mx = *std::max_element(g.begin(), g.end());
  if (mx <= 0) return 1.0;
  return std::accumulate(g.begin(), g.end(), 0.0) / static_cast<double>(g.size()) / mx;
}

double balancedness(const std::vector<int>& phy2log, const std::vector<double>& loads, const Cluster& cluster) {
  return balancedness(gpu_loads(phy2log, loads, cluster));
}

}  // namespace ucpkit::placement
