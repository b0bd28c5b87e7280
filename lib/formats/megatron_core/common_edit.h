// The Megatron-Core common state as the torch_dist converters read and rewrite it (the format's
// strings stay in this room): the layout and model facts of `args`, the distributed optimizer's
// non-tensor state in its fully_reshardable form, and the common state rewritten for a target layout.
// Sources: docs/formats-megatron-core.md (training/checkpointing.py, optimizer/distrib_optimizer.py,
// optimizer/optimizer.py, optimizer/__init__.py, tensor_parallel/layers.py at core_v0.19.0).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::formats::megatron_core {

class Checkpoint;

// The distributed optimizer's per-parameter states (optimizer.state.<state>.<key>) and the universal
// state each becomes (param -> fp32, the others their own name).
inline constexpr const char* kOptimizerStates[] = {"param", "exp_avg", "exp_avg_sq"};
std::string universal_state_name(const std::string& state);

// What the writer and the union read from args (argparse.Namespace); absent fields as noted.
// The common state's args (an argparse.Namespace); throws Error naming `file` when it has none.
pickle::ValuePtr args_of(const pickle::ValuePtr& common, const std::string& file);

struct ArgsFacts {
  int64_t tp = 1, pp = 1, ep = 1, dp = 1;  // *_model_parallel_size, data_parallel_size (1 when absent)
  int64_t etp = 1;                         // expert_tensor_parallel_size (1 when absent or None)
  int64_t num_layers = 0;
  int64_t num_experts = 0;                 // 0: no MoE
  int64_t num_attention_heads = 0;         // 0: not recorded
  int64_t num_query_groups = 0;            // group_query_attention's groups (0: no GQA or not recorded)
  bool swiglu = false;
  bool homogeneous = true;                 // decoder layers stacked (transformer_block.py:730-759)
  std::string transformer_impl;            // args.transformer_impl ("" when absent: no Megatron run chose a spec)
};
// `fallback` gives tp/pp/ep/dp when args does not have them. Throws Error naming `file` when the
// common state has no args.
ArgsFacts args_facts(const pickle::ValuePtr& common, const std::string& file, const ArgsFacts& fallback = {});

// The common state's iteration (0 when absent).
int64_t common_iteration(const pickle::ValuePtr& common);

// The common state in its fully_reshardable form: a copy of the source's with, for a dp_reshardable
// source, each optimizer part's saved state (the `optimizer` ShardedObject of its dp group 0) moved in
// and param_state_sharding_type / content_metadata.distrib_optim_sharding_type fully_reshardable.
pickle::ValuePtr fully_reshardable_common_state(const Checkpoint& ck);

// Megatron's saved param_groups of every optimizer part (dense, then expert), from a common state in
// fully_reshardable form; throws Error naming `file` when a part has none.
std::vector<pickle::ValuePtr> saved_param_groups(const pickle::ValuePtr& common, const std::string& file);
// The "step" of the first of `groups` that has one (torch Adam: the param groups carry it), or null.
pickle::ValuePtr saved_step(const std::vector<pickle::ValuePtr>& groups);

// The target's expert tensor parallelism when --etp is not given: the target TP when the source's equals
// its TP > 1 (Megatron-LM's default ETP = TP, training/arguments.py:569-570 at core_v0.19.0), else the
// source's (a TP 1 source's ETP 1 cannot tell the default from a choice: kept).
int64_t target_expert_tp(int64_t source_etp, int64_t source_tp, int64_t tp);

// The common state for a target layout, in place: args.{tensor,pipeline,expert}_model_parallel_size,
// data_parallel_size and world_size set, no_save_rng true (no RNG state is written); the optimizer parts made what Megatron builds for it (an
// expert optimizer only when EP > 1 or expert TP != TP: tensor_parallel/layers.py:961-964, 1017,
// optimizer/__init__.py:348, 1181-1224; one part is loaded unchained, optimizer/optimizer.py:1573-1578):
// the dense part alone, or an expert part made of the dense part's param_groups marked
// is_expert_parallel when the source had none (saved groups are matched by identifier keys,
// optimizer/distrib_optimizer.py:939-970); an MoE model's args.expert_tensor_parallel_size `etp`.
void set_target_layout(const pickle::ValuePtr& common, int64_t tp, int64_t pp, int64_t ep, int64_t dp, int64_t etp,
                       const std::string& file);

}  // namespace ucpkit::formats::megatron_core
