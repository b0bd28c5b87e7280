// Expert runs inside AutoEP flat ZeRO partitions (docs/formats.md "AutoEP", "AutoEP under ZeRO-3").
#include "formats/deepspeed/autoep_slices.h"

#include <algorithm>

#include "core/error.h"
#include "io/shape.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/zero_partition.h"

namespace ucpkit::formats::deepspeed {

using pickle::Kind;
using pickle::ValuePtr;

std::vector<AutoEpExpertRun> split_fused_expert_run(int64_t at, int64_t numel, int64_t per_expert, int local_experts,
                                                    int ep_rank, const std::string& file, const std::string& name) {
  const int64_t end = at + numel;
  if (per_expert <= 0 || at < 0 || numel < 0 || end > per_expert * local_experts)
    fail(file, "fragment of AutoEP expert weight " + name + " lies outside it");
  std::vector<AutoEpExpertRun> runs;
  for (int64_t pos = at; pos < end;) {
    const int64_t j = pos / per_expert, stop = std::min(end, (j + 1) * per_expert);
    runs.push_back({ep_rank * local_experts + static_cast<int>(j), pos - at, stop - pos});
    pos = stop;
  }
  return runs;
}

AutoEpZero12Slicing autoep_zero12_slicing(const ValuePtr& root, const std::string& file) {
  AutoEpZero12Slicing s;
  ValuePtr layers = root && root->is(Kind::Dict) ? root->get("ds_autoep_layers") : nullptr;
  if (!layers || layers->is_none()) return s;
  std::map<std::string, const AutoEpLayer*> by_weight;
  const auto parsed = parse_autoep_layers(layers, file);
  for (const auto& a : parsed)
    for (const auto& w : autoep_weight_names()) by_weight[a.expert_key_prefix + "." + w] = &a;
  if (auto cfg = root->get("ds_config"); cfg && cfg->is(Kind::Dict))
    if (auto f = cfg->get(kUseDataBeforeExpertParallelism); f && f->is(Kind::Bool)) s.data_before_expert = f->b;
  auto shapes = root->get("param_shapes");
  if (!shapes || !shapes->is_sequence()) fail(file, "AutoEP model states without param_shapes");
  for (const auto& g : shapes->items) {
    int64_t offset = 0;  // ZeRO-1/2 groups: the parameters back to back (_get_zero_param_shapes, engine.py:5244-5284)
    for (const auto& [k, v] : g->entries) {
      const auto shape = v->as_shape();
      const int64_t n = numel_of(shape);
      if (auto a = by_weight.find(k->as_str()); a != by_weight.end()) {
        if (shape.empty() || shape[0] != a->second->num_local_experts)
          fail(file, "AutoEP expert weight " + k->as_str() + " is not [num_local_experts, ...] in param_shapes");
        s.weights[k->as_str()] = {a->second->moe_layer_id, a->second->num_local_experts, offset, n / shape[0]};
      }
      offset += n;
    }
  }
  if (s.weights.size() != by_weight.size()) fail(file, "AutoEP expert weights missing from param_shapes");
  return s;
}

std::vector<AutoEpExpertRun> autoep_zero12_fragment_runs(const AutoEpZero12Weight& w, int ep_rank, int edp_rank,
                                                         int64_t partition, int64_t start, int64_t numel,
                                                         const std::string& file, const std::string& name) {
  // The expert group is partitioned over the expert-DP group: partition edp_rank starts at
  // edp_rank * partition of the flat buffer (stage_1_and_2.py), the weight at w.offset in it.
  const int64_t at = zero12_flat_offset(partition, edp_rank, start) - w.offset;
  return split_fused_expert_run(at, numel, w.per_expert, w.local_experts, ep_rank, file, name);
}

std::vector<AutoEpExpertRun> autoep_zero3_fragment_runs(const std::vector<int64_t>& local_shape, int count, int part,
                                                        int64_t numel, const std::string& file, const std::string& name) {
  if (local_shape.empty() || local_shape[0] < 1 || count < 1 || part < 0)
    fail(file, "AutoEP expert weight " + name + ": bad ZeRO-3 partition (shape, count or part)");
  const int64_t n = numel_of(local_shape);
  const int local_experts = static_cast<int>(local_shape[0]);
  const int64_t per = zero3_slice_numel(n, count);
  const int ep_rank = part / count, prank = part % count;
  return split_fused_expert_run(prank * per, numel, n / local_experts, local_experts, ep_rank, file, name);
}

}  // namespace ucpkit::formats::deepspeed
