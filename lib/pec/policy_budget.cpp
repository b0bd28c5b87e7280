// Budget / popularity selection (MoEtion): S_total = budget / cost_per_expert experts, split across
// layers in proportion to each layer's token risk R[i] (tokens of its experts since their last save),
// floored, then the remainder given by largest fractional part; inside a layer the most popular
// experts first. The cost per expert is the largest expert's size, so the budget always holds.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "pec/policy.h"

namespace ucpkit::pec {

// Splits `total` slots over layers in proportion to `risk`, each capped at `cap[i]` (exposed for tests).
std::vector<int> split_by_risk(int64_t total, const std::vector<int64_t>& risk, const std::vector<int>& cap) {
  const size_t n = risk.size();
  std::vector<int> out(n, 0);
  int64_t capacity = std::accumulate(cap.begin(), cap.end(), int64_t{0});
  total = std::min(total, capacity);
  while (total > 0) {
    // Layers still below their cap share what is left; with no risk anywhere, share evenly.
    std::vector<size_t> open;
    int64_t risk_sum = 0;
    for (size_t i = 0; i < n; ++i)
      if (out[i] < cap[i]) {
        open.push_back(i);
        risk_sum += risk[i];
      }
    if (open.empty()) break;
    std::vector<double> share(n, 0);
    for (size_t i : open)
      share[i] = risk_sum > 0 ? static_cast<double>(total) * static_cast<double>(risk[i]) / static_cast<double>(risk_sum)
                              : static_cast<double>(total) / static_cast<double>(open.size());
    int64_t given = 0;
    for (size_t i : open) {
      int add = static_cast<int>(std::min<double>(std::floor(share[i]), cap[i] - out[i]));
      out[i] += add;
      given += add;
    }
    // Fix the sum: the remainder goes to the largest fractional parts (ties: higher risk, lower index).
    std::vector<size_t> order = open;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      double fa = share[a] - std::floor(share[a]), fb = share[b] - std::floor(share[b]);
      if (fa != fb) return fa > fb;
      if (risk[a] != risk[b]) return risk[a] > risk[b];
      return a < b;
    });
    int64_t left = total - given;
    for (size_t i : order) {
      if (left == 0) break;
      if (out[i] < cap[i]) {
        ++out[i];
        --left;
        ++given;
      }
    }
    total -= given;
    if (given == 0) break;
  }
  return out;
}

namespace {

class BudgetPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "budget"; }

  Selection select(const SelectionRequest& r) const override {
    const int layers = r.shape.num_layers();
    int64_t total = 0;
    if (r.budget_bytes > 0) {
      uint64_t cost = 0;
      for (const auto& row : r.expert_bytes)
        for (uint64_t b : row) cost = std::max(cost, b);
      if (cost == 0) throw UsageError("the budget policy needs the size of each expert");
      total = static_cast<int64_t>(r.budget_bytes / cost);
    } else if (r.k > 0) {
      total = static_cast<int64_t>(r.k) * layers;
    } else {
      throw UsageError("the budget policy needs --budget-bytes (or --bandwidth and --iteration-seconds, or --k)");
    }
    std::vector<int64_t> risk;
    for (int l = 0; l < layers; ++l) risk.push_back(layer_risk(r, l));
    auto per_layer = split_by_risk(total, risk, r.shape.experts_per_layer);
    Selection out;
    for (int l = 0; l < layers; ++l) {
      auto order = experts_by_risk(r, l);
      order.resize(static_cast<size_t>(per_layer[static_cast<size_t>(l)]));
      std::sort(order.begin(), order.end());
      out.push_back(std::move(order));
    }
    return out;
  }
};

[[maybe_unused]] const bool kPolicyBudgetRegistered = register_policy("budget", [] { return std::make_unique<BudgetPolicy>(); });

}  // namespace
}  // namespace ucpkit::pec
