// Fully sharded save plan (MoC-System): which rank writes which expert and which non-expert module,
// so the slowest rank writes as little as possible. Plain data, printable as JSON.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "pec/policy.h"

namespace ucpkit::pec {

struct SaveItem {
  std::string name;     // file or module name (for the plan JSON)
  uint64_t bytes = 0;
  int moe_layer = -1;   // expert items: layer and global expert; -1 for non-expert modules
  int expert = -1;
  bool is_expert() const { return moe_layer >= 0; }
};

struct ShardPlan {
  int world_size = 1;
  int ep_size = 1;
  std::vector<std::vector<size_t>> items_of_rank;  // indices into the item list
  std::vector<uint64_t> bytes_of_rank;
  uint64_t max_rank_bytes() const;
};

// Experts are written by a rank of their own EP rank's expert-data-parallel group (rank g holds EP
// rank g % ep, DeepSpeed's default order; g / (world/ep) with `data_before_expert`), the least loaded
// one, largest first; so saves spread over all EP groups instead of only the first. Then non-expert
// modules, largest first, each to the least loaded rank overall. Deterministic (ties: lowest rank).
ShardPlan plan_fully_sharded(const std::vector<SaveItem>& items, const MoeShape& shape, int world_size,
                             bool data_before_expert = false);

nlohmann::json shard_plan_to_json(const ShardPlan& plan, const std::vector<SaveItem>& items);

}  // namespace ucpkit::pec
