// DeepSpeed AutoEP checkpoint format (docs/formats.md "AutoEP").
#include "layout/deepspeed/autoep.h"

#include <set>

#include "core/error.h"

namespace ucpkit::layout {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

const std::vector<std::string>& autoep_weight_names() {
  static const std::vector<std::string> w = {"w1", "w2", "w3"};
  return w;
}

std::vector<AutoEpLayer> parse_autoep_layers(const ValuePtr& v, const std::string& file) {
  auto fail = [&](const std::string& what) { throw Error(file + ": ds_autoep_layers: " + what); };
  if (!v || v->kind != Kind::List || v->items.empty()) fail("expected a non-empty list of AutoEP layer dicts");
  std::vector<AutoEpLayer> out;
  std::set<std::string> prefixes;
  std::set<int> ids;
  for (size_t i = 0; i < v->items.size(); ++i) {
    const ValuePtr& e = v->items[i];
    const std::string where = "entry " + std::to_string(i);
    if (!e || e->kind != Kind::Dict) fail(where + " is not a dict");
    auto positive = [&](const char* key) {
      ValuePtr x = e->get(key);
      if (!x) fail(where + " has no '" + key + "'");
      if (x->kind != Kind::Int || x->i < 1) fail(where + ": '" + key + "' must be a positive integer, got " + x->repr());
      return static_cast<int>(x->i);
    };
    AutoEpLayer L;
    ValuePtr prefix = e->get("expert_key_prefix");
    if (!prefix) fail(where + " has no 'expert_key_prefix'");
    if (prefix->kind != Kind::Str || prefix->s.empty()) fail(where + ": 'expert_key_prefix' must be a non-empty string");
    L.expert_key_prefix = prefix->s;
    L.num_experts = positive("num_experts");
    L.num_local_experts = positive("num_local_experts");
    L.ep_size = positive("ep_size");
    ValuePtr id = e->get("moe_layer_id");
    if (!id || id->kind != Kind::Int || id->i < 0) fail(where + ": 'moe_layer_id' must be a non-negative integer");
    L.moe_layer_id = static_cast<int>(id->i);
    if (auto m = e->get("module_path"); m && m->kind == Kind::Str) L.module_path = m->s;
    if (auto f = e->get("checkpoint_format"); f && f->kind == Kind::Str) L.checkpoint_format = f->s;
    if (L.num_experts != L.num_local_experts * L.ep_size)
      fail(where + " (" + L.expert_key_prefix + "): num_experts " + std::to_string(L.num_experts) +
           " != num_local_experts " + std::to_string(L.num_local_experts) + " * ep_size " + std::to_string(L.ep_size));
    if (!prefixes.insert(L.expert_key_prefix).second) fail("expert_key_prefix " + L.expert_key_prefix + " appears twice");
    if (!ids.insert(L.moe_layer_id).second) fail("moe_layer_id " + std::to_string(L.moe_layer_id) + " appears twice");
    if (!out.empty() && out.front().ep_size != L.ep_size)
      fail("layers with different ep_size (" + std::to_string(out.front().ep_size) + ", " + std::to_string(L.ep_size) +
           "); DeepSpeed saves one EP group size (engine.py:5018-5022)");
    out.push_back(std::move(L));
  }
  return out;
}

std::string autoep_expert_file_name(int moe_layer_id, int global_expert, int mp_rank) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "layer_%d_expert_%d_mp_rank_%02d_model_states.pt", moe_layer_id, global_expert, mp_rank);
  return buf;
}

std::string autoep_expert_file_key(const std::string& prefix, const std::string& weight, int global_expert) {
  return prefix + "." + weight + "." + std::to_string(global_expert);
}

void retarget_autoep_layers(const ValuePtr& layers, int ep, int dp) {
  if (!layers || layers->kind != Kind::List) return;
  for (const auto& e : layers->items) {
    if (!e || e->kind != Kind::Dict) continue;
    auto n = e->get("num_experts");
    if (!n || n->kind != Kind::Int) continue;
    const int64_t per = n->i / ep;
    auto set = [&](const char* key, ValuePtr v) {
      if (e->contains(key)) e->set_item(key, std::move(v));
    };
    set("ep_size", Value::integer(ep));
    set("num_local_experts", Value::integer(per));
    set("ep_group_name", Value::str("ep_size_" + std::to_string(ep)));
    set("ep_rank", Value::integer(0));
    set("expert_data_parallel_rank", Value::integer(0));
    set("expert_data_parallel_world_size", Value::integer(dp / ep));
    set("global_expert_start", Value::integer(0));
    set("global_expert_end", Value::integer(per));
  }
}

ValuePtr autoep_universal_state(const ValuePtr& param, int num_experts) {
  auto d = Value::dict();
  d->set_item("param", param);
  d->set_item("cat_dim", Value::integer(0));
  d->set_item("is_expert_param", Value::boolean(true));
  d->set_item("ep_num_experts", Value::integer(num_experts));
  return d;
}

}  // namespace ucpkit::layout
