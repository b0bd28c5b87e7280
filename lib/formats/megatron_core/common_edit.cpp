#include "formats/megatron_core/common_edit.h"

#include <algorithm>

#include "core/error.h"
#include "formats/megatron_core/reader.h"

namespace ucpkit::formats::megatron_core {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

int64_t int_attr(const ValuePtr& args, const char* name, int64_t fallback) {
  const auto v = args ? args->attr(name) : nullptr;
  return v && v->is(Kind::Int) ? v->i : fallback;
}

// The parts of the common state's "optimizer" entry: itself (one optimizer: it holds
// param_state_sharding_type), or the values of a ChainedOptimizer's {0: ..., 1: ...} in key order.
std::vector<ValuePtr> optimizer_parts(const ValuePtr& optimizer) {
  if (!optimizer || !optimizer->is(Kind::Dict)) return {};
  if (optimizer->contains("param_state_sharding_type") || optimizer->contains("optimizer")) return {optimizer};
  std::vector<ValuePtr> parts;
  for (const auto& [k, v] : optimizer->entries)
    if (k && k->is(Kind::Int) && v && v->is(Kind::Dict)) parts.push_back(v);
  return parts;
}

}  // namespace

ValuePtr args_of(const ValuePtr& common, const std::string& file) {
  const auto a = common && common->is(Kind::Dict) ? common->get("args") : nullptr;
  if (!a || !a->is(Kind::Object)) fail(file, "Megatron-Core common state without args (argparse.Namespace)");
  return a;
}

std::string universal_state_name(const std::string& state) { return state == "param" ? "fp32" : state; }

ArgsFacts args_facts(const ValuePtr& common, const std::string& file, const ArgsFacts& fallback) {
  const ValuePtr a = args_of(common, file);
  ArgsFacts f;
  f.tp = int_attr(a, "tensor_model_parallel_size", fallback.tp);
  f.pp = int_attr(a, "pipeline_model_parallel_size", fallback.pp);
  f.ep = int_attr(a, "expert_model_parallel_size", fallback.ep);
  f.dp = int_attr(a, "data_parallel_size", fallback.dp);
  f.etp = int_attr(a, "expert_tensor_parallel_size", 1);
  f.num_layers = int_attr(a, "num_layers", 0);
  f.num_experts = int_attr(a, "num_experts", 0);
  f.num_attention_heads = int_attr(a, "num_attention_heads", 0);
  const auto gqa = a->attr("group_query_attention");
  if (gqa && gqa->is(Kind::Bool) && gqa->b) f.num_query_groups = int_attr(a, "num_query_groups", 0);
  const auto sw = a->attr("swiglu");
  f.swiglu = sw && sw->is(Kind::Bool) && sw->b;
  // transformer_block.py:730-759: moe_layer_freq / linear_attention_freq a list or an int > 1,
  // heterogeneous block specs.
  const auto freq = a->attr("moe_layer_freq");
  const auto lin = a->attr("linear_attention_freq");
  const auto het = a->attr("heterogeneous_layers_config_path");
  const bool non_homogeneous = (freq && (freq->is(Kind::List) || (freq->is(Kind::Int) && freq->i > 1))) ||
                               (lin && (lin->is(Kind::List) || (lin->is(Kind::Int) && lin->i > 1))) ||
                               (het && !het->is_none());
  f.homogeneous = !non_homogeneous;
  if (const auto impl = a->attr("transformer_impl"); impl && impl->is(Kind::Str)) f.transformer_impl = impl->s;
  return f;
}

int64_t common_iteration(const ValuePtr& common) {
  const auto it = common && common->is(Kind::Dict) ? common->get("iteration") : nullptr;
  return it && it->is(Kind::Int) ? it->i : 0;
}

ValuePtr fully_reshardable_common_state(const Checkpoint& ck) {
  const ValuePtr root = pickle::deep_copy(ck.common().root);
  const auto parts = optimizer_parts(root->get("optimizer"));
  if (ck.optimizer_format() == OptimizerFormat::DpReshardable) {
    // Each part's saved optimizer state is the ShardedObject `optimizer` of its dp group 0
    // (optimizer/distrib_optimizer.py:1533-1547); a ChainedOptimizer prefixes chained_{i}.
    for (size_t i = 0; i < parts.size(); ++i) {
      const std::string prefix = parts.size() > 1 ? "chained_" + std::to_string(i) + "." : "";
      parts[i]->set_item("optimizer", ck.read_object(prefix + "optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1"));
    }
  }
  for (const auto& part : parts)
    if (part->contains("param_state_sharding_type")) part->set_item("param_state_sharding_type", Value::str("fully_reshardable"));
  if (const auto cm = root->get("content_metadata"); cm && cm->is(Kind::Dict)) {
    cm->set_item("distrib_optim_sharding_type", Value::str("fully_reshardable"));
    if (!cm->contains("distrib_optim_fully_reshardable_mem_efficient"))
      cm->set_item("distrib_optim_fully_reshardable_mem_efficient", Value::boolean(false));
  }
  return root;
}

std::vector<ValuePtr> saved_param_groups(const ValuePtr& common, const std::string& file) {
  std::vector<ValuePtr> groups;
  for (const auto& part : optimizer_parts(common ? common->get("optimizer") : nullptr)) {
    const auto opt = part->get("optimizer");
    const auto pg = opt ? opt->get("param_groups") : nullptr;
    if (!pg || !pg->is(Kind::List)) fail(file, "Megatron-Core common state: an optimizer part without param_groups");
    for (const auto& g : pg->items) groups.push_back(g);
  }
  return groups;
}

ValuePtr saved_step(const std::vector<ValuePtr>& groups) {
  for (const auto& g : groups)
    if (const auto s = g && g->is(Kind::Dict) ? g->get("step") : nullptr; s && !s->is_none()) return s;
  return nullptr;
}

int64_t target_expert_tp(int64_t source_etp, int64_t source_tp, int64_t tp) {
  // Megatron-LM's default, ETP = TP (training/arguments.py:569-570); at TP 1 the source's 1 says nothing.
  return source_etp == source_tp && source_tp > 1 ? tp : source_etp;
}

namespace {

// The expert part of a ChainedOptimizer made from one unchained part `dense`: its is_expert_parallel
// groups moved out of `dense` when it has some (a Hugging Face import's fresh groups), else a copy of its
// groups marked is_expert_parallel (a dense source's optimizer settings hold for the experts too).
ValuePtr split_expert_part(ValuePtr& dense) {
  auto groups_of = [](const ValuePtr& part) {
    const auto opt = part->get("optimizer");
    const auto groups = opt ? opt->get("param_groups") : nullptr;
    return groups && groups->is(Kind::List) ? groups : nullptr;
  };
  auto is_expert = [](const ValuePtr& g) {
    const auto e = g && g->is(Kind::Dict) ? g->get("is_expert_parallel") : nullptr;
    return e && e->is(Kind::Bool) && e->b;
  };
  const auto groups = groups_of(dense);
  const bool has_expert_groups = groups && std::any_of(groups->items.begin(), groups->items.end(), is_expert);
  ValuePtr expert = pickle::deep_copy(dense);
  const auto expert_groups = groups_of(expert);
  if (!has_expert_groups) {
    if (expert_groups)
      for (const auto& g : expert_groups->items)
        if (g && g->is(Kind::Dict)) g->set_item("is_expert_parallel", Value::boolean(true));
    return expert;
  }
  dense = pickle::deep_copy(dense);
  auto keep = [&](const ValuePtr& list, bool experts) {
    std::vector<ValuePtr> kept;
    for (const auto& g : list->items)
      if (is_expert(g) == experts) kept.push_back(g);
    list->items = std::move(kept);
  };
  keep(groups_of(dense), false);
  keep(expert_groups, true);
  return expert;
}

}  // namespace

void set_target_layout(const ValuePtr& common, int64_t tp, int64_t pp, int64_t ep, int64_t dp, int64_t etp,
                       const std::string& file) {
  const ValuePtr a = args_of(common, file);
  a->set_attr("tensor_model_parallel_size", Value::integer(tp));
  a->set_attr("pipeline_model_parallel_size", Value::integer(pp));
  a->set_attr("expert_model_parallel_size", Value::integer(ep));
  a->set_attr("data_parallel_size", Value::integer(dp));
  a->set_attr("world_size", Value::integer(tp * pp * dp));
  // No rng_state is written (its ShardedObject holds one rank's Python, NumPy, torch and CUDA generators
  // per (PP, TP) rank of the source's grid). Megatron's default load asks for it whenever the args' TP
  // and PP equal the run's, unless the args say no_save_rng (training/checkpointing.py:2170-2193 at
  // core_v0.19.0, :1560-1570 at core_v0.16.1): marked so, it seeds afresh, as it does itself when it
  // loads a checkpoint saved at another TP or PP.
  a->set_attr("no_save_rng", Value::boolean(true));
  const auto parts = optimizer_parts(common->get("optimizer"));
  if (parts.empty()) return;
  const int64_t experts = int_attr(a, "num_experts", 0);
  if (experts > 0) a->set_attr("expert_tensor_parallel_size", Value::integer(etp));
  const bool expert_part = experts > 0 && (ep > 1 || etp != tp);
  if (!expert_part) {
    common->set_item("optimizer", parts[0]);
    return;
  }
  ValuePtr dense = parts[0];
  ValuePtr expert = parts.size() > 1 ? parts[1] : nullptr;
  if (!expert) expert = split_expert_part(dense);
  auto chained = Value::dict();
  chained->entries.push_back({Value::integer(0), dense});
  chained->entries.push_back({Value::integer(1), expert});
  common->set_item("optimizer", chained);
}

}  // namespace ucpkit::formats::megatron_core
