// Expert selection for partial expert checkpointing: one small interface, one registered
// implementation per policy (policy_sequential.cpp, policy_load_aware.cpp, policy_budget.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pec/tokens.h"

namespace ucpkit::pec {

// Shape of the MoE part of a model: experts per MoE layer and the expert-parallel degree.
struct MoeShape {
  std::vector<int> experts_per_layer;
  int ep_size = 1;
  int num_layers() const { return static_cast<int>(experts_per_layer.size()); }
  int total_experts() const;
  // EP rank holding a global expert (experts are split into EP equal consecutive blocks).
  int ep_rank_of(int layer, int expert) const;
};

struct SelectionRequest {
  MoeShape shape;
  int64_t save_index = 0;   // saves this tier committed before this one (drives rotation)
  int k = 0;                // experts per layer (sequential, load-aware; budget without bytes)
  uint64_t budget_bytes = 0;                        // budget policy
  std::vector<std::vector<uint64_t>> expert_bytes;  // [layer][expert] bytes one save costs
  TokenMatrix unsaved_tokens;                       // [layer][expert] tokens since its last save
  std::vector<std::vector<int64_t>> last_saved_step;  // [layer][expert], -1 when never saved
};

// Sorted global expert ids to save, per MoE layer.
using Selection = std::vector<std::vector<int>>;

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  virtual std::string_view name() const = 0;
  // Deterministic: the same request always gives the same selection. Throws UsageError when the
  // request lacks what the policy needs.
  virtual Selection select(const SelectionRequest& request) const = 0;
};

using PolicyFactory = std::function<std::unique_ptr<SelectionPolicy>()>;
// Returns true so a policy can register itself from a namespace-scope initializer.
bool register_policy(const std::string& name, PolicyFactory factory);
// Throws UsageError listing the known names when `name` is unknown.
std::unique_ptr<SelectionPolicy> make_policy(std::string_view name);
std::vector<std::string> policy_names();

// Shared helpers for implementations.
// Experts of one layer ordered by (tokens since last save desc, older last save first, id asc).
std::vector<int> experts_by_risk(const SelectionRequest& r, int layer);
// Total tokens since last save of one layer (MoEtion's token risk R[i]).
int64_t layer_risk(const SelectionRequest& r, int layer);
int64_t unsaved(const SelectionRequest& r, int layer, int expert);
// Splits `total` slots over layers in proportion to `risk`, capped per layer (floor, then the
// remainder by largest fractional part); the budget policy's layer split.
std::vector<int> split_by_risk(int64_t total, const std::vector<int64_t>& risk, const std::vector<int>& cap);

}  // namespace ucpkit::pec
