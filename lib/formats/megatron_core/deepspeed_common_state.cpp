// Megatron-Core common state for a Megatron-DeepSpeed source.
#include "formats/megatron_core/deepspeed_common_state.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "core/error.h"
#include "io/torch/torch_file.h"

namespace ucpkit::formats::megatron_core {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// Sets args.<name> only where Megatron-DeepSpeed's args do not have it (its own value is never replaced).
void set_if_absent(const ValuePtr& args, const char* name, const ValuePtr& v) {
  if (!args->attr(name)) args->set_attr(name, v);
}

int64_t args_int(const ValuePtr& args, const char* name, int64_t dflt) {
  const auto v = args->attr(name);
  return v && v->is(Kind::Int) ? v->i : dflt;
}

double number_of(const ValuePtr& v, double dflt) {
  if (!v) return dflt;
  if (v->is(Kind::Float)) return v->f;
  if (v->is(Kind::Int)) return static_cast<double>(v->i);
  return dflt;
}

// Megatron-Core's model-architecture fields, from Megatron-DeepSpeed's names where they differ. Only what
// the source says is written; nothing is guessed (a field Megatron-DeepSpeed's args lack stays absent).
void add_architecture_fields(const ValuePtr& args) {
  const int64_t heads = args_int(args, "num_attention_heads", 0);
  const int64_t hidden = args_int(args, "hidden_size", 0);
  // GQA: Megatron-DeepSpeed's num_key_value_heads (megatron/arguments.py) is Megatron-Core's
  // num_query_groups, with group_query_attention set when it is below the head count (Megatron-LM
  // core_v0.19.0 megatron/training/arguments.py:215,226 write the same pair from a Hugging Face config).
  if (const auto kv = args->attr("num_key_value_heads"); kv && kv->is(Kind::Int) && !args->attr("num_query_groups")) {
    args->set_attr("num_query_groups", Value::integer(kv->i));
    set_if_absent(args, "group_query_attention", Value::boolean(heads > 0 && kv->i < heads));
  }
  // kv_channels = hidden / heads when not given (arguments.py:1291-1293).
  if (heads > 0 && hidden > 0) {
    const auto kc = args->attr("kv_channels");
    if (!kc || kc->is_none()) args->set_attr("kv_channels", Value::integer(hidden / heads));
  }
  // Megatron-DeepSpeed's --normalization takes layernorm | rmsnorm; Megatron-Core's LayerNorm | RMSNorm.
  if (const auto n = args->attr("normalization"); n && n->is(Kind::Str)) {
    if (n->s == "layernorm") args->set_attr("normalization", Value::str("LayerNorm"));
    if (n->s == "rmsnorm") args->set_attr("normalization", Value::str("RMSNorm"));
  }
  // Megatron-DeepSpeed's --use-rotary-position-embeddings is Megatron-Core's position_embedding_type rope
  // (Megatron-LM arguments.py:2314 position_embedding_type, :2332 the same deprecated flag).
  // Megatron-DeepSpeed's --rotary-position-embeddings-theta (dest rope_theta, megatron/arguments.py:635-637 at
  // 4efb479) is Megatron-Core's rotary_base.
  if (const auto t = args->attr("rope_theta"); t && (t->is(Kind::Int) || t->is(Kind::Float)) && !args->attr("rotary_base"))
    args->set_attr("rotary_base", Value::real(t->as_float()));
  if (const auto r = args->attr("use_rotary_position_embeddings"); r && r->is(Kind::Bool) && !args->attr("position_embedding_type"))
    args->set_attr("position_embedding_type", Value::str(r->b ? "rope" : "learned_absolute"));
  // What ucp-load --format torch_dist writes: a DistributedOptimizer's fully_reshardable state in a
  // torch_dist save (checkpointing.py:497-503 reads both to build the content metadata).
  args->set_attr("use_distributed_optimizer", Value::boolean(true));
  args->set_attr("ckpt_format", Value::str("torch_dist"));
  args->set_attr("dist_ckpt_optim_fully_reshardable", Value::boolean(true));
}

// The scheduler state Megatron-Core's load_checkpoint hands to OptimizerParamScheduler.load_state_dict
// (checkpointing.py:2597-2602; it reads max_lr|start_lr, min_lr, the warm-up and decay steps and style,
// num_steps|num_iters: optimizer_param_scheduler.py:346-390). Megatron-DeepSpeed's engine saves its
// client scheduler's state_dict as `lr_scheduler`; when that is Megatron's OptimizerParamScheduler (the
// same class in Megatron-DeepSpeed, same keys) it is taken as it is. Otherwise (DeepSpeed's own
// schedulers: last_batch_iteration, _last_lr) a constant schedule at the saved learning rate is written,
// num_steps = args.consumed_train_samples (Megatron steps its scheduler by the global batch size,
// training.py train_step); Megatron's loader compares it with the job's own schedule
// (optimizer_param_scheduler.py:318-339), so such a job loads with --override-opt_param-scheduler or
// --use-checkpoint-opt_param-scheduler.
ValuePtr scheduler_state(const ValuePtr& model_states, const ValuePtr& args, const ValuePtr& param_groups) {
  std::vector<ValuePtr> groups;
  if (param_groups && param_groups->is_sequence())
    for (const auto& g : param_groups->items)
      if (g && g->is(Kind::Dict)) groups.push_back(g);
  const auto ls = pickle::entry_of(model_states, "lr_scheduler");
  if (ls && ls->is(Kind::Dict) && ls->contains("min_lr") && (ls->contains("max_lr") || ls->contains("start_lr")) &&
      (ls->contains("num_steps") || ls->contains("num_iters")))
    return pickle::deep_copy(ls);
  double lr = 0.0;
  if (!groups.empty()) lr = number_of(groups.front()->get("lr"), 0.0);
  if (ls && ls->is(Kind::Dict))
    if (const auto last = ls->get("_last_lr"); last && last->is_sequence() && !last->items.empty())
      lr = number_of(last->items.front(), lr);
  double wd = 0.0;
  for (const auto& g : groups) wd = std::max(wd, number_of(g->get("weight_decay"), 0.0));
  wd = number_of(args->attr("weight_decay"), wd);
  const ValuePtr s = Value::dict();
  // Megatron-DeepSpeed's --lr / --min-lr (the same arguments as Megatron-LM's) when the args have them.
  s->set_item("max_lr", Value::real(number_of(args->attr("lr"), lr)));
  s->set_item("lr_warmup_steps", Value::integer(0));
  s->set_item("num_steps", Value::integer(args_int(args, "consumed_train_samples", 0)));
  s->set_item("lr_decay_style", Value::str("constant"));
  s->set_item("lr_decay_steps", Value::integer(1));
  s->set_item("min_lr", Value::real(number_of(args->attr("min_lr"), lr)));
  s->set_item("start_wd", Value::real(wd));
  s->set_item("end_wd", Value::real(wd));
  s->set_item("wd_incr_style", Value::str("constant"));
  s->set_item("wd_incr_steps", Value::integer(1));
  return s;
}

}  // namespace

ValuePtr common_state_from_deepspeed(const ValuePtr& model_states, const std::string& model_file,
                                     const ValuePtr& optimizer_state, const ValuePtr& step) {
  const ValuePtr args0 = pickle::entry_of(model_states, "args");
  if (!args0 || !args0->is(Kind::Object)) throw Error(model_file + ": no Megatron args (argparse.Namespace)");
  const ValuePtr args = pickle::deep_copy(args0);
  // Native DeepSpeed MoE: Megatron-DeepSpeed's num_experts is a list per MoE layer group and its MoE
  // layers are those with i % expert_interval == expert_interval - 1 (get_num_experts_per_layer,
  // megatron/model/transformer.py); Megatron-Core wants one count and a per-layer 0/1 list
  // (moe_layer_freq, megatron/training/arguments.py) and expert_model_parallel_size.
  // A dense model's is [1] (--num-experts' default, megatron/arguments.py:608 at 4efb479: a layer of one expert is
  // a plain MLP, gpt_model.py's is_moe_model).
  const auto ne = args->attr("num_experts");
  if (ne && ne->is_sequence() && ne->items.size() == 1 && ne->items.front()->is(Kind::Int) && ne->items.front()->i == 1)
    args->set_attr("num_experts", Value::none());
  else if (ne && ne->is_sequence() && !ne->items.empty()) {
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
    // --topk (megatron/arguments.py at 4efb479): the experts each token goes to, Megatron-Core's moe_router_topk.
    if (const auto k = args->attr("topk"); k && k->is(Kind::Int)) set_if_absent(args, "moe_router_topk", Value::integer(k->i));
    // --moe-loss-coeff (arguments.py:919): Megatron-Core's moe_aux_loss_coeff.
    if (const auto c = args->attr("moe_loss_coeff"); c && (c->is(Kind::Float) || c->is(Kind::Int)))
      set_if_absent(args, "moe_aux_loss_coeff", Value::real(c->as_float()));
  }
  add_architecture_fields(args);
  const ValuePtr root = Value::dict();
  root->set_item("args", args);
  root->set_item("checkpoint_version", Value::real(3.0));
  const auto it = pickle::entry_of(model_states, "iteration");
  root->set_item("iteration", it && it->is(Kind::Int) ? it : Value::integer(0));
  const ValuePtr sched = scheduler_state(model_states, args, pickle::entry_of(optimizer_state, "param_groups"));
  std::vector<ValuePtr> groups;
  if (const auto pg = pickle::entry_of(optimizer_state, "param_groups"); pg && pg->is_sequence()) {
    for (const auto& g : pg->items) {
      if (!g || !g->is(Kind::Dict)) continue;
      const ValuePtr c = pickle::deep_copy(g);
      c->erase("params");
      if (step) c->set_item("step", step);
      // Megatron-Core's scheduler sets each group's weight decay to its schedule times wd_mult (default
      // 1.0) and the lr from max_lr / min_lr of the group or the scheduler (optimizer_param_scheduler.py:
      // 226-227, 297-300): a no-decay group of the source needs wd_mult 0 (Megatron-Core's own no-decay
      // group has it, optimizer/__init__.py _get_param_groups), lr_mult 1.
      if (!c->contains("wd_mult")) c->set_item("wd_mult", Value::real(number_of(c->get("weight_decay"), 0.0) > 0 ? 1.0 : 0.0));
      if (!c->contains("lr_mult")) c->set_item("lr_mult", Value::real(1.0));
      if (!c->contains("is_expert_parallel")) {
        const auto moe = c->get("moe");
        c->set_item("is_expert_parallel", Value::boolean(moe && moe->is(Kind::Bool) && moe->b));
      }
      // DistributedOptimizer.load_state_dict pairs the job's groups with the saved ones by the tuple of
      // param_group_identifier_keys (distrib_optimizer.py:937-970; optimizer.py:139-149 with
      // ParamGroupOverride's max_lr, min_lr, start_wd, end_wd, wd_mult, optimizer:
      // optimizer_param_scheduler.py:19-37): max_lr / min_lr are the job's --lr / --min-lr there
      // (optimizer/__init__.py), so they are written from the scheduler state above, is_decoupled_lr
      // false; start_wd, end_wd, optimizer stay absent (None, as Megatron's default groups have them).
      if (!c->contains("max_lr")) c->set_item("max_lr", sched->get("max_lr"));
      if (!c->contains("min_lr")) c->set_item("min_lr", sched->get("min_lr"));
      if (!c->contains("is_decoupled_lr")) c->set_item("is_decoupled_lr", Value::boolean(false));
      if (!c->contains("default_config")) c->set_item("default_config", Value::boolean(true));
      groups.push_back(c);
    }
  }
  const ValuePtr inner = Value::dict();
  inner->set_item("param_groups", Value::list(groups));
  const ValuePtr opt = Value::dict();
  opt->set_item("optimizer", inner);
  // A DistributedOptimizer's state_dict names the format of its sharded part (distrib_optimizer.py:1579).
  opt->set_item("param_state_sharding_type", Value::str("fully_reshardable"));
  root->set_item("optimizer", opt);
  root->set_item("opt_param_scheduler", sched);
  // Megatron's save_checkpoint stores it (checkpointing.py:764); load reads it with default 0 (:2488).
  root->set_item("num_floating_point_operations_so_far", Value::integer(0));
  // The content metadata a fully_reshardable DistributedOptimizer save carries (checkpointing.py:497-507),
  // read back by load_checkpoint (:2198) to build the matching sharded state dict: without it Megatron
  // expects the dp_reshardable ShardedObject optimizer.distributed.dp_group_idx_0.optimizer.
  const ValuePtr cm = Value::dict();
  cm->set_item("distrib_optim_sharding_type", Value::str("fully_reshardable"));
  cm->set_item("distrib_optim_fully_reshardable_mem_efficient", Value::boolean(false));
  cm->set_item("singleton_local_shards", Value::boolean(false));
  cm->set_item("chained_optim_avoid_prefix", Value::boolean(true));
  root->set_item("content_metadata", cm);
  return root;
}

std::vector<std::string> extra_state_keys(const std::vector<std::string>& param_names, bool stacked) {
  // decoder.layers.<L>.<module>.linear_<x>.(weight|bias); experts: <...>.experts.experts.<e>.linear_<x>.
  static const std::regex linear(R"(decoder\.layers\.(\d+)\.((?:[A-Za-z0-9_]+\.)*linear_[A-Za-z0-9_]+)\.(weight|bias))");
  static const std::regex expert(R"((.*\.experts\.experts)\.(\d+)\.(linear_[A-Za-z0-9_]+))");
  std::set<int64_t> layers;
  std::set<std::pair<int64_t, std::string>> dense;                    // (layer, module)
  std::map<std::pair<int64_t, std::string>, std::set<int64_t>> experts;  // (layer, experts module) -> ids
  std::smatch m, e;
  for (const auto& n : param_names) {
    if (n.rfind("decoder.layers.", 0) == 0) {
      const auto dot = n.find('.', 15);
      if (dot != std::string::npos && dot > 15 && std::isdigit(static_cast<unsigned char>(n[15])))
        layers.insert(std::stoll(n.substr(15, dot - 15)));
    }
    if (!std::regex_match(n, m, linear)) continue;
    const int64_t layer = std::stoll(m[1].str());
    const std::string mod = m[2].str();
    if (std::regex_match(mod, e, expert))
      experts[{layer, e[1].str() + "." + e[3].str()}].insert(std::stoll(e[2].str()));
    else
      dense.insert({layer, mod});
  }
  std::vector<std::string> keys;
  // A homogeneous stack (every layer MoE, moe_layer_freq 1; or dense): each key with the layer axis
  // prepended (transformer_block.py:730-759), the experts' with the expert axis after it
  // (shard_<l>.<e>_<L>.<E>, as megatron-core 0.16.1's sharded_state_dict of an all-MoE GPTModel names them).
  if (stacked || experts.empty()) {
    std::set<std::string> modules;  // "<module>", or "<experts module>/<E>"
    for (const auto& [l, mod] : dense) modules.insert(mod);
    for (const auto& [lm, ids] : experts) modules.insert(lm.second + "/" + std::to_string(ids.size()));
    const auto count = std::to_string(layers.size());
    for (const auto& mod : modules) {
      const auto slash = mod.find('/');
      for (int64_t l = 0; l < static_cast<int64_t>(layers.size()); ++l) {
        if (slash == std::string::npos) {
          keys.push_back("decoder.layers." + mod + "._extra_state/shard_" + std::to_string(l) + "_" + count);
          continue;
        }
        const std::string n = mod.substr(slash + 1);
        for (int64_t e = 0; e < std::stoll(n); ++e)
          keys.push_back("decoder.layers." + mod.substr(0, slash) + "._extra_state/shard_" + std::to_string(l) + "." +
                         std::to_string(e) + "_" + count + "." + n);
      }
    }
    return keys;
  }
  // Mixed dense / MoE layers: per-layer keys (decoder.layers.<L>., no layer axis: shard_0_1), the experts'
  // with the expert axis (shard_<e>_<E>), as the real Megatron-Core MoE save has them
  // (tests/formats/megatron_core/data/moe_ep2).
  for (const auto& [l, mod] : dense)
    keys.push_back("decoder.layers." + std::to_string(l) + "." + mod + "._extra_state/shard_0_1");
  for (const auto& [lm, ids] : experts)
    for (const int64_t id : ids)
      keys.push_back("decoder.layers." + std::to_string(lm.first) + "." + lm.second + "._extra_state/shard_" +
                     std::to_string(id) + "_" + std::to_string(ids.size()));
  return keys;
}

ValuePtr extra_state_objects(const std::vector<std::string>& param_names, bool stacked, const std::string& scratch_dir) {
  const ValuePtr out = Value::dict(true);
  const auto keys = extra_state_keys(param_names, stacked);
  if (keys.empty()) return out;
  // torch.save([None]) as Megatron's torch_dist strategy stores a ShardedObject's data (the bytes a real
  // save holds for every local-spec linear: tests/formats/megatron_core/data, ucp-union's objects.pt).
  const std::string tmp = (std::filesystem::path(scratch_dir) / ".ucp-extra-state-item").string();
  save_torch_file(tmp, Value::list(std::vector<ValuePtr>{Value::none()}));
  std::string bytes;
  {
    std::ifstream in(tmp, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) throw Error(tmp + ": read failed");
  }
  std::filesystem::remove(tmp);
  for (const auto& k : keys) out->set_item(k, Value::bytes(bytes));
  return out;
}

ValuePtr megatron_deepspeed_args(const deepspeed::MegatronGpt& m, int64_t padded) {
  auto a = Value::make_object("argparse", "Namespace", Value::tuple(), Value::dict(), pickle::Object::Build::NewObj);
  auto i = [&](const char* name, int64_t v) { a->set_attr(name, Value::integer(v)); };
  auto b = [&](const char* name, bool v) { a->set_attr(name, Value::boolean(v)); };
  i("num_layers", m.layers);
  i("hidden_size", m.hidden);
  i("ffn_hidden_size", m.ffn);
  i("num_attention_heads", m.heads);
  i("num_key_value_heads", m.kv_heads);
  i("kv_channels", m.head_dim);
  i("max_position_embeddings", m.max_positions);
  i("seq_length", m.max_positions);
  b("use_rotary_position_embeddings", true);
  i("rope_theta", m.rope_theta);
  a->set_attr("rotary_percent", Value::real(1.0));
  b("add_position_embedding", false);
  i("make_vocab_size_divisible_by", deepspeed::kGptVocabMultiple);
  i("padded_vocab_size", padded);
  a->set_attr("normalization", Value::str("rmsnorm"));
  a->set_attr("layernorm_epsilon", Value::real(m.norm_eps));
  b("apply_layernorm_1p", false);
  b("swiglu", true);
  b("untie_embeddings_and_output_weights", !m.tied);
  b("add_bias_linear", false);
  if (m.experts > 0) {  // native MoE in every layer (--num-experts, --expert-interval, --topk)
    a->set_attr("num_experts", Value::list({Value::integer(m.experts)}));
    i("expert_interval", 1);
    i("topk", m.topk);
    a->set_attr("moe_loss_coeff", Value::real(m.aux_loss));
  } else {
    a->set_attr("num_experts", Value::none());
  }
  b("bf16", m.dtype == DType::BFloat16);
  b("fp16", m.dtype == DType::Float16);
  a->set_attr("params_dtype", Value::torch_dtype(m.dtype));
  for (const char* n : {"tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "world_size",
                        "moe_expert_parallel_size", "zero_stage"})
    i(n, 1);
  i("iteration", 0);
  i("consumed_train_samples", 0);
  return a;
}

int64_t padded_vocab_size(const ValuePtr& model_states) {
  const ValuePtr args = pickle::entry_of(model_states, "args");
  const ValuePtr v = args && args->is(Kind::Object) ? args->attr("padded_vocab_size") : nullptr;
  return v && v->is(Kind::Int) ? v->i : 0;
}

}  // namespace ucpkit::formats::megatron_core
