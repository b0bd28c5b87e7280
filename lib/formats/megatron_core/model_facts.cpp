// Model facts from Megatron-Core args (model_facts.h). Arg names and defaults: Megatron-LM
// core_v0.19.0 megatron/training/arguments.py and megatron/core/transformer/transformer_config.py.
#include "formats/megatron_core/model_facts.h"

#include <algorithm>

#include "core/error.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/deepspeed_common_state.h"

namespace ucpkit::formats::megatron_core {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

struct Args {
  ValuePtr a;
  std::string file;

  ValuePtr get(const char* name) const {
    const auto v = a->attr(name);
    return v && !v->is_none() ? v : nullptr;
  }
  int64_t integer(const char* name, int64_t fallback = -1) const {
    const auto v = get(name);
    if (!v) {
      if (fallback < 0) fail(file, std::string("args.") + name + " is missing (a model size the configuration needs)");
      return fallback;
    }
    if (!v->is(Kind::Int)) fail(file, std::string("args.") + name + " is not an integer");
    return v->i;
  }
  double real(const char* name, double fallback) const {
    const auto v = get(name);
    return v && (v->is(Kind::Float) || v->is(Kind::Int)) ? v->as_float() : fallback;
  }
  bool flag(const char* name) const {
    const auto v = get(name);
    return v && v->is(Kind::Bool) && v->b;
  }
  std::string text(const char* name, const std::string& fallback) const {
    const auto v = get(name);
    return v && v->is(Kind::Str) ? v->s : fallback;
  }
  [[noreturn]] void refuse(const std::string& what) const {
    fail(file, what + ": no Hugging Face configuration states this model's math (docs/hf.md)");
  }
};

// MoE settings whose math no Hugging Face MoE family computes (transformer_config.py's moe_* fields).
void moe_refusals(const Args& a) {
  const std::string score = a.text("moe_router_score_function", "softmax");
  if (score != "softmax") a.refuse("args.moe_router_score_function is '" + escaped_brief(score, 30) + "', not 'softmax'");
  if (a.flag("moe_router_enable_expert_bias")) a.refuse("args.moe_router_enable_expert_bias is set (a routing bias)");
  if (a.get("moe_router_topk_scaling_factor")) a.refuse("args.moe_router_topk_scaling_factor is set (scaled routing weights)");
  if (a.get("moe_router_num_groups")) a.refuse("args.moe_router_num_groups is set (group-limited routing)");
  if (a.get("moe_expert_capacity_factor")) a.refuse("args.moe_expert_capacity_factor is set (tokens dropped)");
}

// The decoder layers without experts: args.moe_layer_freq as Megatron-Core builds the layers from it
// (core_v0.16.1 gpt_layer_specs.py:579-596: an int N makes layer i MoE when i % N == 0, a list is the
// pattern itself, 1 MoE and 0 dense, one entry per layer).
nlohmann::json dense_layers(const Args& a, int64_t layers) {
  nlohmann::json out = nlohmann::json::array();
  const auto freq = a.get("moe_layer_freq");
  if (!freq) return out;
  if (freq->is(Kind::Int)) {
    if (freq->i < 1) fail(a.file, "args.moe_layer_freq is " + std::to_string(freq->i) + " (a positive integer or a list expected)");
    for (int64_t l = 0; l < layers; ++l)
      if (l % freq->i != 0) out.push_back(l);
    return out;
  }
  if (!freq->is(Kind::List) || static_cast<int64_t>(freq->items.size()) != layers)
    fail(a.file, "args.moe_layer_freq is neither an integer nor a list of one 0 or 1 per layer (" + std::to_string(layers) + " layers)");
  for (int64_t l = 0; l < layers; ++l) {
    const auto& v = freq->items[static_cast<size_t>(l)];
    if (!v || !v->is(Kind::Int) || (v->i != 0 && v->i != 1))
      fail(a.file, "args.moe_layer_freq[" + std::to_string(l) + "] is not 0 or 1");
    if (v->i == 0) out.push_back(l);
  }
  return out;
}

}  // namespace

nlohmann::json model_facts(const ValuePtr& common, const std::string& file) {
  const Args a{args_of(common, file), file};
  nlohmann::json f;
  f["hidden"] = a.integer("hidden_size");
  f["layers"] = a.integer("num_layers");
  const int64_t heads = a.integer("num_attention_heads");
  f["heads"] = heads;
  f["kv_heads"] = a.flag("group_query_attention") ? a.integer("num_query_groups") : heads;
  f["head_dim"] = a.integer("kv_channels", f["hidden"].get<int64_t>() / heads);
  f["ffn"] = a.integer("ffn_hidden_size", 4 * f["hidden"].get<int64_t>());
  f["max_positions"] = a.integer("max_position_embeddings", a.integer("seq_length", 0));
  // --norm-epsilon: args.norm_epsilon up to core_v0.16, layernorm_epsilon (transformer_config.py:194) later.
  f["norm_eps"] = a.get("norm_epsilon") ? a.real("norm_epsilon", 1e-5) : a.real("layernorm_epsilon", 1e-5);
  f["rope_theta"] = a.real("rotary_base", 10000.0);
  // rotary_pos_embedding.py:92-120 (_apply_scaling: Llama 3.1's factor, low 1, high 4, original 8192).
  f["rope_llama3_factor"] = a.flag("use_rope_scaling") ? a.real("rope_scaling_factor", 8.0) : 0.0;
  f["tied"] = !a.flag("untie_embeddings_and_output_weights");
  f["linear_bias"] = a.get("add_bias_linear") ? a.flag("add_bias_linear") : true;  // Megatron's default: on
  f["qkv_bias"] = a.flag("add_qkv_bias");
  f["qk_norm"] = a.flag("qk_layernorm");
  f["experts"] = a.integer("num_experts", 0);
  f["moe_ffn"] = a.integer("moe_ffn_hidden_size", f["ffn"].get<int64_t>());
  f["moe_topk"] = a.integer("moe_router_topk", 2);
  f["shared_ffn"] = a.integer("moe_shared_expert_intermediate_size", 0);
  // The shared expert's output scaled by sigmoid(x . gate_weight) (transformer/moe/shared_experts.py:128-130).
  f["shared_gate"] = f["shared_ffn"].get<int64_t>() > 0 && a.flag("moe_shared_expert_gate");
  f["dense_layers"] = f["experts"].get<int64_t>() > 0 ? dense_layers(a, f["layers"].get<int64_t>()) : nlohmann::json::array();
  // The router (transformer/moe/router.py topk_routing_with_score_function): softmax over the top k
  // logits by default, over all logits before the top k with --moe-router-pre-softmax.
  f["moe_pre_softmax"] = a.flag("moe_router_pre_softmax");
  f["moe_aux_loss"] = a.real("moe_aux_loss_coeff", 0.0);
  if (f["experts"].get<int64_t>() > 0) moe_refusals(a);

  const std::string pos = a.text("position_embedding_type", "learned_absolute");
  if (pos != "rope") a.refuse("args.position_embedding_type is '" + escaped_brief(pos, 30) + "', not 'rope'");
  if (a.real("rotary_percent", 1.0) != 1.0) a.refuse("args.rotary_percent is not 1.0 (partial rotary)");
  if (a.flag("rotary_interleaved")) a.refuse("args.rotary_interleaved is set (interleaved rotary pairs)");
  const std::string norm = a.text("normalization", "LayerNorm");
  if (norm != "RMSNorm") a.refuse("args.normalization is '" + escaped_brief(norm, 30) + "', not 'RMSNorm'");
  if (a.flag("layernorm_zero_centered_gamma") || a.flag("apply_layernorm_1p"))
    a.refuse("args.layernorm_zero_centered_gamma is set (norm weights stored minus one)");
  if (!a.flag("swiglu")) a.refuse("args.swiglu is not set (the MLP is not SwiGLU)");
  return f;
}

pickle::ValuePtr megatron_args(const nlohmann::json& f, DType dtype) {
  using pickle::Value;
  auto a = Value::make_object("argparse", "Namespace", Value::tuple(), Value::dict(), pickle::Object::Build::NewObj);
  auto i = [&](const char* name, int64_t v) { a->set_attr(name, Value::integer(v)); };
  auto b = [&](const char* name, bool v) { a->set_attr(name, Value::boolean(v)); };
  i("num_layers", f.at("layers"));
  i("hidden_size", f.at("hidden"));
  i("ffn_hidden_size", f.at("ffn"));
  i("num_attention_heads", f.at("heads"));
  b("group_query_attention", f.at("kv_heads") != f.at("heads"));
  i("num_query_groups", f.at("kv_heads"));
  i("kv_channels", f.at("head_dim"));
  i("max_position_embeddings", f.at("max_positions"));
  i("seq_length", f.at("max_positions"));
  i("padded_vocab_size", f.at("vocab"));
  i("vocab_size", f.at("vocab"));
  a->set_attr("norm_epsilon", Value::real(f.at("norm_eps").get<double>()));
  a->set_attr("rotary_base", Value::real(f.at("rope_theta").get<double>()));
  a->set_attr("rotary_percent", Value::real(1.0));
  b("rotary_interleaved", false);
  const double factor = f.value("rope_llama3_factor", 0.0);
  b("use_rope_scaling", factor > 0);
  a->set_attr("rope_scaling_factor", Value::real(factor > 0 ? factor : 8.0));
  a->set_attr("position_embedding_type", Value::str("rope"));
  a->set_attr("normalization", Value::str("RMSNorm"));
  b("swiglu", true);
  b("add_bias_linear", f.value("linear_bias", false));
  b("add_qkv_bias", f.value("qkv_bias", false));
  b("qk_layernorm", f.value("qk_norm", false));
  b("untie_embeddings_and_output_weights", !f.value("tied", false));
  if (const int64_t experts = f.value("experts", int64_t{0}); experts > 0) {
    // Megatron-LM's argument names (training/arguments.py); the grouped GEMM needs Transformer Engine.
    i("num_experts", experts);
    i("moe_ffn_hidden_size", f.at("moe_ffn"));
    i("moe_router_topk", f.at("moe_topk"));
    b("moe_router_pre_softmax", f.value("moe_pre_softmax", false));
    a->set_attr("moe_aux_loss_coeff", Value::real(f.value("moe_aux_loss", 0.0)));
    a->set_attr("moe_router_load_balancing_type", Value::str("aux_loss"));
    a->set_attr("moe_token_dispatcher_type", Value::str("allgather"));
    b("moe_grouped_gemm", false);
    // A list (the pattern, 1: MoE) where some layers are dense, as Megatron-LM's --moe-layer-freq parses it.
    const auto& dense = f.contains("dense_layers") ? f["dense_layers"] : nlohmann::json::array();
    if (dense.empty()) {
      i("moe_layer_freq", 1);
    } else {
      std::vector<pickle::ValuePtr> pattern;
      for (int64_t l = 0; l < f.at("layers").get<int64_t>(); ++l)
        pattern.push_back(Value::integer(std::find(dense.begin(), dense.end(), l) == dense.end() ? 1 : 0));
      a->set_attr("moe_layer_freq", Value::list(std::move(pattern)));
    }
    if (const int64_t shared = f.value("shared_ffn", int64_t{0}); shared > 0) {
      i("moe_shared_expert_intermediate_size", shared);
      b("moe_shared_expert_gate", f.value("shared_gate", false));
    }
    i("expert_tensor_parallel_size", 1);
  }
  b("bf16", dtype == DType::BFloat16);
  b("fp16", dtype == DType::Float16);
  for (const char* n : {"tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
                        "data_parallel_size", "world_size"})
    i(n, 1);
  i("iteration", 0);
  return a;
}

pickle::ValuePtr fresh_common_state(const nlohmann::json& facts, DType dtype, const pickle::ValuePtr& optimizer_state,
                                    const pickle::ValuePtr& step, const std::string& where) {
  auto model_states = pickle::Value::dict();
  model_states->set_item("args", megatron_args(facts, dtype));
  model_states->set_item("iteration", pickle::Value::integer(0));
  return common_state_from_deepspeed(model_states, where, optimizer_state, step);
}

}  // namespace ucpkit::formats::megatron_core
