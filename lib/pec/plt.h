// Proportion of lost tokens (MoC-System), dynamic K, the post-recovery capacity plan (MoEtion) and
// the checkpoint size formula C_pec / C_full.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pec/tokens.h"

namespace ucpkit::pec {

struct Plt {
  double overall = 0;            // mean over MoE layers
  std::vector<double> per_layer;  // lost / (tokens * top-k) of each layer
};

// lost[l][e]: tokens processed by expert e of layer l whose updates the restore loses;
// processed[l][e]: all tokens it processed over the same training span. Per layer:
// sum(lost) / sum(processed) (sum(processed) = tokens * top-k, minus dropped tokens); 0 for a layer
// that processed nothing.
Plt compute_plt(const TokenMatrix& lost, const TokenMatrix& processed);

// Dynamic K: double K (at least 1, at most the largest layer's E) when PLT passes the threshold.
int next_k(int k, int max_experts, double plt, double threshold);

struct CapacityEntry {
  int moe_layer = 0;
  int expert = 0;
  double capacity_factor = 1.1;
  int64_t iterations = 0;  // iterations of extra capacity needed to make up the lost tokens
  int64_t lost_tokens = 0;
};

// Experts that lost tokens get `capacity_factor` (1.1 = +10%) until the extra capacity has processed
// their lost tokens: iterations = ceil(lost / ((factor - 1) * tokens_per_iteration)), where the rate is
// the expert's own, or its layer's mean when the expert's rate is unknown or zero.
std::vector<CapacityEntry> capacity_plan(const TokenMatrix& lost, const std::vector<std::vector<double>>& tokens_per_iteration,
                                         double capacity_factor = 1.1);

// C_full = (P_ne + P_e)(B_w + B_o); C_pec = (P_ne + K/E * P_e)(B_w + B_o). Returns C_pec / C_full.
double pec_size_ratio(double non_expert_params, double expert_params, double k, double experts);

// Lost tokens of every restore of a store's chain (`<store>/plt-history.json`), so that PLT adds up
// over the whole run (MoC-System's PLT is over all failures since training began).
// A restore made without token counts has its losses unknown (nullopt, `null` in the file).
struct PltHistory {
  std::vector<std::pair<int64_t, std::optional<TokenMatrix>>> restores;  // restored step, lost tokens per expert
};
// Empty when the file is absent; throws Error naming the file when it is damaged.
PltHistory load_plt_history(const std::string& store_dir);
void save_plt_history(const std::string& store_dir, const PltHistory& h);  // atomic, durable
// Records a restore at `step`. Records of the same or later steps are dropped: restoring `step`
// abandons the timeline they belonged to (and restoring one step twice counts once).
void add_restore(PltHistory& h, int64_t step, const std::optional<TokenMatrix>& lost);
// Sum of the recorded lost tokens, in the shape of `experts_per_layer`; nullopt when a recorded
// restore's losses are unknown (the sum would be a false lower bound).
std::optional<TokenMatrix> total_lost(const PltHistory& h, const std::vector<int>& experts_per_layer);

// {"overall": x, "per_layer": [...]}; both `null` for an unknown PLT (no token counts: not 0).
nlohmann::json plt_to_json(const std::optional<Plt>& p);
nlohmann::json capacity_plan_to_json(const std::vector<CapacityEntry>& plan);

}  // namespace ucpkit::pec
