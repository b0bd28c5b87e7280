// Policy registry and helpers shared by the selection policies.
#include "pec/policy.h"

#include <algorithm>

#include "core/error.h"
#include "core/registry.h"

namespace ucpkit::pec {
namespace {
Registry<SelectionPolicy>& registry() {
  static Registry<SelectionPolicy> r("selection policy");
  return r;
}
}  // namespace

int MoeShape::total_experts() const {
  int n = 0;
  for (int e : experts_per_layer) n += e;
  return n;
}

int MoeShape::ep_rank_of(int layer, int expert) const {
  int e = experts_per_layer.at(static_cast<size_t>(layer));
  if (ep_size <= 1 || e % ep_size != 0) return 0;
  return expert / (e / ep_size);
}

bool register_policy(const std::string& name, PolicyFactory factory) {
  registry().add(name, std::move(factory));
  return true;
}

std::unique_ptr<SelectionPolicy> make_policy(std::string_view name) { return registry().make(name); }

std::vector<std::string> policy_names() { return registry().names(); }

int64_t unsaved(const SelectionRequest& r, int layer, int expert) {
  if (static_cast<size_t>(layer) >= r.unsaved_tokens.size()) return 0;
  const auto& row = r.unsaved_tokens[static_cast<size_t>(layer)];
  return static_cast<size_t>(expert) < row.size() ? row[static_cast<size_t>(expert)] : 0;
}

static int64_t last_saved(const SelectionRequest& r, int layer, int expert) {
  if (static_cast<size_t>(layer) >= r.last_saved_step.size()) return -1;
  const auto& row = r.last_saved_step[static_cast<size_t>(layer)];
  return static_cast<size_t>(expert) < row.size() ? row[static_cast<size_t>(expert)] : -1;
}

std::vector<int> experts_by_risk(const SelectionRequest& r, int layer) {
  int n = r.shape.experts_per_layer.at(static_cast<size_t>(layer));
  std::vector<int> order(static_cast<size_t>(n));
  for (int e = 0; e < n; ++e) order[static_cast<size_t>(e)] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    int64_t ta = unsaved(r, layer, a), tb = unsaved(r, layer, b);
    if (ta != tb) return ta > tb;
    int64_t sa = last_saved(r, layer, a), sb = last_saved(r, layer, b);
    if (sa != sb) return sa < sb;
    return a < b;
  });
  return order;
}

int64_t layer_risk(const SelectionRequest& r, int layer) {
  int64_t sum = 0;
  int n = r.shape.experts_per_layer.at(static_cast<size_t>(layer));
  for (int e = 0; e < n; ++e) sum += unsaved(r, layer, e);
  return sum;
}

}  // namespace ucpkit::pec
