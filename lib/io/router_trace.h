// Router traces: the JSONL files training jobs write with, per line, the experts one MoE layer routed
// tokens to. One parser for every tool that reads them (moe-replace --loads, pec-save/pec-restore
// --tokens), so a trace one tool accepts the other accepts too.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ucpkit::io {

// Token-expert assignments per iteration, MoE layer and expert.
struct RouterTrace {
  // iteration -> counts[moe_layer][expert]; every matrix has the same number of layers (the trace's)
  // and of experts (`experts`). Records without an iteration key are iteration 0.
  std::map<int64_t, std::vector<std::vector<int64_t>>> iterations;
  size_t layers = 0;
  size_t experts = 0;  // highest expert id seen + 1, or the largest `num_experts` field if larger

  // The counts of every iteration added up ([layers][experts]); Error naming `name` on int64 overflow.
  std::vector<std::vector<int64_t>> total(const std::string& name) const;
};

// Parses router-trace JSONL: one JSON object per non-blank line with
//  * the MoE layer: `moe_layer` (the MoE layer index itself), or `layer` / `layer_idx` / `layer_number`
//    (transformer-layer ids: Megatron numbers every transformer layer, so with MoE every other layer a
//    trace reads 1, 3, 5, ...; unless the distinct ids already are 0..L-1 they are mapped, in sorted
//    order, onto MoE layers 0..L-1); none of them: layer 0 (a one-layer trace). A trace uses one kind;
//  * the routing: the expert ids of each token (`top_indices`, `topk_ids`, `experts`, `indices`,
//    `expert_ids`; an id or nested lists of ids, flattened), or per-expert counts (`tokens_per_expert`,
//    `expert_counts`, `counts`), or one `expert` with its `tokens`;
//  * optionally `iteration` or `step`, and `num_experts`.
// Counts are integers in [0, 2^53]. Throws Error "<name>: line N: ..." on anything else.
RouterTrace parse_router_trace(std::string_view text, const std::string& name);

}  // namespace ucpkit::io
