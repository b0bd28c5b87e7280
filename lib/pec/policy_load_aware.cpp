// Load-aware selection (MoC-System): per layer, the K experts with the most tokens routed to them
// since they were last saved (ties: least recently saved, then lowest id).
#include <algorithm>

#include "core/error.h"
#include "pec/policy.h"

namespace ucpkit::pec {
namespace {

class LoadAwarePolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "load-aware"; }

  Selection select(const SelectionRequest& r) const override {
    if (r.k <= 0) throw UsageError("the load-aware policy needs --k (experts per MoE layer) >= 1");
    Selection out;
    for (int l = 0; l < r.shape.num_layers(); ++l) {
      auto order = experts_by_risk(r, l);
      order.resize(std::min(order.size(), static_cast<size_t>(r.k)));
      std::sort(order.begin(), order.end());
      out.push_back(std::move(order));
    }
    return out;
  }
};

[[maybe_unused]] const bool kPolicyLoadAwareRegistered = register_policy("load-aware", [] { return std::make_unique<LoadAwarePolicy>(); });

}  // namespace
}  // namespace ucpkit::pec
