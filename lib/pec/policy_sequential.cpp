// Sequential selection (MoC-System): rotate through the experts of each layer, K per save, with the
// rotation interleaved across EP ranks and offset per layer so every rank saves about as many
// experts as the others; K consecutive saves windows cover a layer within ceil(E/K) saves.
#include <algorithm>

#include "core/error.h"
#include "pec/policy.h"

namespace ucpkit::pec {
namespace {

class SequentialPolicy final : public SelectionPolicy {
 public:
  std::string_view name() const override { return "sequential"; }

  Selection select(const SelectionRequest& r) const override {
    if (r.k <= 0) throw UsageError("the sequential policy needs --k (experts per MoE layer) >= 1");
    Selection out;
    for (int l = 0; l < r.shape.num_layers(); ++l) {
      const int e = r.shape.experts_per_layer[static_cast<size_t>(l)];
      const int k = std::min(r.k, e);
      const int ep = (r.shape.ep_size > 1 && e % r.shape.ep_size == 0) ? r.shape.ep_size : 1;
      const int per_rank = e / ep;
      // Position p in the interleaved order visits EP ranks round-robin: rank p % ep, local p / ep.
      auto expert_at = [&](int64_t p) { return static_cast<int>((p % ep) * per_rank + p / ep); };
      const int64_t start = ((r.save_index + l) % e) * static_cast<int64_t>(k);
      std::vector<int> chosen;
      for (int i = 0; i < k; ++i) chosen.push_back(expert_at((start + i) % e));
      std::sort(chosen.begin(), chosen.end());
      out.push_back(std::move(chosen));
    }
    return out;
  }
};

[[maybe_unused]] const bool kPolicySequentialRegistered = register_policy("sequential", [] { return std::make_unique<SequentialPolicy>(); });

}  // namespace
}  // namespace ucpkit::pec
