// PLT, dynamic K, capacity plan, size formula.
#include "pec/plt.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"

namespace ucpkit::pec {

Plt compute_plt(const TokenMatrix& lost, const TokenMatrix& processed) {
  Plt p;
  size_t layers = std::max(lost.size(), processed.size());
  double sum = 0;
  for (size_t l = 0; l < layers; ++l) {
    int64_t lo = 0, pr = 0;
    if (l < lost.size())
      for (int64_t v : lost[l]) lo += v;
    if (l < processed.size())
      for (int64_t v : processed[l]) pr += v;
    double x = pr > 0 ? static_cast<double>(lo) / static_cast<double>(pr) : 0.0;
    p.per_layer.push_back(x);
    sum += x;
  }
  p.overall = layers ? sum / static_cast<double>(layers) : 0.0;
  return p;
}

int next_k(int k, int max_experts, double plt, double threshold) {
  k = std::max(k, 1);
  if (plt > threshold) k *= 2;
  return std::min(k, std::max(max_experts, 1));
}

std::vector<CapacityEntry> capacity_plan(const TokenMatrix& lost, const std::vector<std::vector<double>>& rate,
                                         double capacity_factor) {
  std::vector<CapacityEntry> out;
  const double boost = capacity_factor - 1.0;
  for (size_t l = 0; l < lost.size(); ++l) {
    double layer_mean = 0;
    if (l < rate.size() && !rate[l].empty()) {
      for (double r : rate[l]) layer_mean += r;
      layer_mean /= static_cast<double>(rate[l].size());
    }
    for (size_t e = 0; e < lost[l].size(); ++e) {
      if (lost[l][e] <= 0) continue;
      double r = (l < rate.size() && e < rate[l].size()) ? rate[l][e] : 0.0;
      if (r <= 0) r = layer_mean;
      CapacityEntry c;
      c.moe_layer = static_cast<int>(l);
      c.expert = static_cast<int>(e);
      c.capacity_factor = capacity_factor;
      c.lost_tokens = lost[l][e];
      // With no rate known at all, one iteration per lost token is the only honest bound.
      double per_iter = boost > 0 && r > 0 ? boost * r : 1.0;
      c.iterations = static_cast<int64_t>(std::ceil(static_cast<double>(lost[l][e]) / per_iter - 1e-9));
      out.push_back(c);
    }
  }
  return out;
}

double pec_size_ratio(double p_ne, double p_e, double k, double e) {
  double full = p_ne + p_e;
  if (full <= 0 || e <= 0) return 1.0;
  return (p_ne + std::min(k, e) / e * p_e) / full;
}

nlohmann::json plt_to_json(const std::optional<Plt>& p) {
  if (!p) return {{"overall", nullptr}, {"per_layer", nullptr}};
  return {{"overall", p->overall}, {"per_layer", p->per_layer}};
}

nlohmann::json capacity_plan_to_json(const std::vector<CapacityEntry>& plan) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& c : plan)
    a.push_back({{"moe_layer", c.moe_layer}, {"expert", c.expert}, {"capacity_factor", c.capacity_factor},
                 {"iterations", c.iterations}, {"lost_tokens", c.lost_tokens}});
  return a;
}

namespace {
constexpr const char* kHistoryFile = "plt-history.json";
constexpr const char* kHistoryFormat = "ucpkit-pec-plt-history/1";
}  // namespace

PltHistory load_plt_history(const std::string& store_dir) {
  PltHistory h;
  const std::string path = store_dir + "/" + kHistoryFile;
  if (!std::filesystem::exists(path)) return h;
  try {
    auto j = nlohmann::json::parse(read_text_file(path));
    if (j.at("format").get<std::string>() != kHistoryFormat) fail(path, "unknown format");
    for (const auto& r : j.at("restores")) {
      std::optional<TokenMatrix> lost;
      if (!r.at("lost").is_null()) lost = r.at("lost").get<TokenMatrix>();
      h.restores.emplace_back(r.at("step").get<int64_t>(), std::move(lost));
    }
  } catch (const nlohmann::json::exception& e) {
    fail(path, std::string("damaged PLT history: ") + e.what());
  }
  return h;
}

void save_plt_history(const std::string& store_dir, const PltHistory& h) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& [step, lost] : h.restores)
    a.push_back({{"step", step}, {"lost", lost ? nlohmann::json(*lost) : nlohmann::json(nullptr)}});
  write_file_atomic(store_dir + "/" + kHistoryFile, nlohmann::json{{"format", kHistoryFormat}, {"restores", a}}.dump() + "\n", true);
}

void add_restore(PltHistory& h, int64_t step, const std::optional<TokenMatrix>& lost) {
  std::erase_if(h.restores, [&](const auto& r) { return r.first >= step; });
  h.restores.emplace_back(step, lost);
}

std::optional<TokenMatrix> total_lost(const PltHistory& h, const std::vector<int>& experts_per_layer) {
  TokenMatrix t = zero_tokens(experts_per_layer);
  for (const auto& [step, lost] : h.restores) {
    if (!lost) return std::nullopt;
    for (size_t l = 0; l < t.size() && l < lost->size(); ++l)
      for (size_t e = 0; e < t[l].size() && e < (*lost)[l].size(); ++e) t[l][e] += (*lost)[l][e];
  }
  return t;
}

}  // namespace ucpkit::pec
