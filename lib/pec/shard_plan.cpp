// Fully sharded save plan.
#include "pec/shard_plan.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"

namespace ucpkit::pec {

uint64_t ShardPlan::max_rank_bytes() const {
  return bytes_of_rank.empty() ? 0 : *std::max_element(bytes_of_rank.begin(), bytes_of_rank.end());
}

ShardPlan plan_fully_sharded(const std::vector<SaveItem>& items, const MoeShape& shape, int world_size,
                             bool data_before_expert) {
  if (world_size < 1) throw Error("world size must be >= 1");
  ShardPlan plan;
  plan.world_size = world_size;
  plan.ep_size = std::max(shape.ep_size, 1);
  plan.items_of_rank.resize(static_cast<size_t>(world_size));
  plan.bytes_of_rank.assign(static_cast<size_t>(world_size), 0);
  const int ep = plan.ep_size;
  const bool grouped = world_size % ep == 0;  // otherwise EP groups cannot be formed: any rank

  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].is_expert() != items[b].is_expert()) return items[a].is_expert();
    return items[a].bytes > items[b].bytes;
  });

  auto assign = [&](size_t item, int rank) {
    plan.items_of_rank[static_cast<size_t>(rank)].push_back(item);
    plan.bytes_of_rank[static_cast<size_t>(rank)] += items[item].bytes;
  };
  for (size_t i : order) {
    const SaveItem& it = items[i];
    int best = -1;
    for (int g = 0; g < world_size; ++g) {
      if (it.is_expert() && grouped && ep > 1) {
        int ep_rank = data_before_expert ? g / (world_size / ep) : g % ep;
        if (ep_rank != shape.ep_rank_of(it.moe_layer, it.expert)) continue;
      }
      if (best < 0 || plan.bytes_of_rank[static_cast<size_t>(g)] < plan.bytes_of_rank[static_cast<size_t>(best)]) best = g;
    }
    assign(i, best);
  }
  for (auto& v : plan.items_of_rank) std::sort(v.begin(), v.end());
  return plan;
}

nlohmann::json shard_plan_to_json(const ShardPlan& plan, const std::vector<SaveItem>& items) {
  nlohmann::json ranks = nlohmann::json::array();
  for (int g = 0; g < plan.world_size; ++g) {
    nlohmann::json experts = nlohmann::json::array(), modules = nlohmann::json::array();
    for (size_t i : plan.items_of_rank[static_cast<size_t>(g)]) {
      const SaveItem& it = items[i];
      if (it.is_expert())
        experts.push_back({{"moe_layer", it.moe_layer}, {"expert", it.expert}, {"bytes", it.bytes}});
      else
        modules.push_back({{"name", it.name}, {"bytes", it.bytes}});
    }
    ranks.push_back({{"rank", g}, {"bytes", plan.bytes_of_rank[static_cast<size_t>(g)]},
                     {"experts", experts}, {"non_expert", modules}});
  }
  return {{"world_size", plan.world_size}, {"ep_size", plan.ep_size}, {"max_rank_bytes", plan.max_rank_bytes()},
          {"ranks", ranks}};
}

}  // namespace ucpkit::pec
