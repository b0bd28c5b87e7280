// Megatron-Core common state for a Megatron-DeepSpeed source.
#include "formats/megatron_core/deepspeed_common_state.h"

#include <string>

#include "core/error.h"

namespace ucpkit::formats::megatron_core {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

ValuePtr common_state_from_deepspeed(const ValuePtr& model_states, const std::string& model_file,
                                     const ValuePtr& optimizer_state, const ValuePtr& step) {
  const ValuePtr args0 = pickle::entry_of(model_states, "args");
  if (!args0 || !args0->is(Kind::Object)) throw Error(model_file + ": no Megatron args (argparse.Namespace)");
  const ValuePtr args = pickle::deep_copy(args0);
  // Native DeepSpeed MoE: Megatron-DeepSpeed's num_experts is a list per MoE layer group and its MoE
  // layers are those with i % expert_interval == expert_interval - 1 (get_num_experts_per_layer,
  // megatron/model/transformer.py); Megatron-Core wants one count and a per-layer 0/1 list
  // (moe_layer_freq, megatron/training/arguments.py) and expert_model_parallel_size.
  if (const auto ne = args->attr("num_experts"); ne && ne->is_sequence() && !ne->items.empty()) {
    const int64_t experts = ne->items.front()->as_int();
    for (const auto& e : ne->items)
      if (e->as_int() != experts)
        throw Error(model_file + ": args.num_experts differs between MoE layers; Megatron-Core has one count");
    args->set_attr("num_experts", Value::integer(experts));
    const auto interval = args->attr("expert_interval");
    const auto layers = args->attr("num_layers");
    if (!layers || !layers->is(Kind::Int)) throw Error(model_file + ": args.num_layers missing");
    const int64_t every = interval && interval->is(Kind::Int) && interval->i > 0 ? interval->i : 1;
    std::vector<ValuePtr> freq;
    for (int64_t i = 0; i < layers->i; ++i) freq.push_back(Value::integer(i % every == every - 1 ? 1 : 0));
    args->set_attr("moe_layer_freq", Value::list(std::move(freq)));
    if (const auto ep = args->attr("moe_expert_parallel_size"); ep && ep->is(Kind::Int))
      args->set_attr("expert_model_parallel_size", Value::integer(ep->i));
  }
  const ValuePtr root = Value::dict();
  root->set_item("args", args);
  root->set_item("checkpoint_version", Value::real(3.0));
  const auto it = pickle::entry_of(model_states, "iteration");
  root->set_item("iteration", it && it->is(Kind::Int) ? it : Value::integer(0));
  std::vector<ValuePtr> groups;
  if (const auto pg = pickle::entry_of(optimizer_state, "param_groups"); pg && pg->is_sequence()) {
    for (const auto& g : pg->items) {
      if (!g || !g->is(Kind::Dict)) continue;
      const ValuePtr c = pickle::deep_copy(g);
      c->erase("params");
      if (step) c->set_item("step", step);
      groups.push_back(c);
    }
  }
  const ValuePtr inner = Value::dict();
  inner->set_item("param_groups", Value::list(std::move(groups)));
  const ValuePtr opt = Value::dict();
  opt->set_item("optimizer", inner);
  root->set_item("optimizer", opt);
  return root;
}

int64_t padded_vocab_size(const ValuePtr& model_states) {
  const ValuePtr args = pickle::entry_of(model_states, "args");
  const ValuePtr v = args && args->is(Kind::Object) ? args->attr("padded_vocab_size") : nullptr;
  return v && v->is(Kind::Int) ? v->i : 0;
}

}  // namespace ucpkit::formats::megatron_core
