// DeepSpeed AutoEP checkpoint format (docs/formats.md "AutoEP").
#include "formats/deepspeed/autoep.h"

#include <set>

#include "core/error.h"
#include "formats/deepspeed/moe.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/universal/state_file.h"
#include "io/shape.h"

namespace ucpkit::formats::deepspeed {

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
    auto optional_int = [&](const char* key, int& to) {
      if (auto x = e->get(key); x && x->kind == Kind::Int) to = static_cast<int>(x->i);
    };
    optional_int("checkpoint_format_version", L.checkpoint_format_version);
    optional_int("ep_rank", L.ep_rank);
    optional_int("expert_data_parallel_rank", L.expert_data_parallel_rank);
    optional_int("expert_data_parallel_world_size", L.expert_data_parallel_world_size);
    optional_int("global_expert_start", L.global_expert_start);
    optional_int("global_expert_end", L.global_expert_end);
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

void check_autoep_zero3_layers(const std::vector<AutoEpLayer>& layers, const std::string& file) {
  for (const auto& L : layers) {
    auto fail = [&](const std::string& what) {
      throw Error(file + ": ds_autoep_layers (" + L.expert_key_prefix + "): " + what);
    };
    if (!L.zero3_partitioned())
      fail("checkpoint_format is '" + L.checkpoint_format +
           "' in a ZeRO-3 checkpoint; DeepSpeed converts only 'zero3_partitioned' (ds_to_universal.py:990-992)");
    if (L.checkpoint_format_version != 1)
      fail("unsupported checkpoint_format_version " + std::to_string(L.checkpoint_format_version) +
           " (version 1 is known, autoep_zero3_metadata.py:75-79)");
    if (L.ep_rank < 0 || L.ep_rank >= L.ep_size || L.expert_data_parallel_rank < 0 ||
        L.expert_data_parallel_world_size < 1 || L.expert_data_parallel_rank >= L.expert_data_parallel_world_size)
      fail("ep_rank / expert_data_parallel_rank / expert_data_parallel_world_size missing or out of range "
           "(autoep_zero3_metadata.py:72-74)");
    const int start = L.ep_rank * L.num_local_experts;
    if (L.global_expert_start != start || L.global_expert_end != start + L.num_local_experts)
      fail("global expert range [" + std::to_string(L.global_expert_start) + ", " + std::to_string(L.global_expert_end) +
           ") but ep_rank " + std::to_string(L.ep_rank) + " holds [" + std::to_string(start) + ", " +
           std::to_string(start + L.num_local_experts) + ") (autoep_zero3_metadata.py:89-94)");
  }
}

std::vector<Zero3PartitionGroup> parse_zero3_partition_groups(const ValuePtr& osd, const std::string& file) {
  std::vector<Zero3PartitionGroup> out;
  ValuePtr v = osd && osd->kind == Kind::Dict ? osd->get("ds_zero_partition_groups") : nullptr;
  if (!v || v->is_none()) return out;
  auto fail = [&](const std::string& what) { throw Error(file + ": ds_zero_partition_groups: " + what); };
  if (!v->is_sequence()) fail("not a list");
  for (size_t i = 0; i < v->items.size(); ++i) {
    const ValuePtr& e = v->items[i];
    const std::string where = "entry " + std::to_string(i);
    if (!e || e->kind != Kind::Dict) fail(where + " is not a dict");
    Zero3PartitionGroup g;
    auto get_int = [&](const char* key) {
      ValuePtr x = e->get(key);
      if (!x || x->kind != Kind::Int) fail(where + " has no integer '" + key + "'");
      return static_cast<int>(x->i);
    };
    if (get_int("sub_group") != static_cast<int>(i)) fail(where + ": sub_group is not " + std::to_string(i));
    g.partition_count = get_int("partition_count");
    g.partition_rank = get_int("partition_rank");
    if (g.partition_count < 1 || g.partition_rank < 0 || g.partition_rank >= g.partition_count)
      fail(where + ": partition_rank " + std::to_string(g.partition_rank) + " of partition_count " +
           std::to_string(g.partition_count));
    if (auto r = e->get("partition_ranks"); r && r->is_sequence())
      for (const auto& x : r->items) g.partition_ranks.push_back(static_cast<int>(x->as_int()));
    if (auto f = e->get("families"); f && f->is_sequence())
      for (const auto& x : f->items)
        if (x && x->kind == Kind::Str && x->s == "autoep_expert") g.autoep_expert = true;
    out.push_back(std::move(g));
  }
  return out;
}

ValuePtr zero3_partition_groups_value(const std::vector<Zero3PartitionGroup>& groups, const std::string& ep_group_name) {
  auto out = Value::list();
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    auto ranks = Value::list();
    for (int r : g.partition_ranks) ranks->items.push_back(Value::integer(r));
    auto e = Value::dict();
    e->set_item("sub_group", Value::integer(static_cast<int64_t>(i)));
    e->set_item("partition_count", Value::integer(g.partition_count));
    e->set_item("partition_rank", Value::integer(g.partition_rank));
    e->set_item("partition_ranks", ranks);
    e->set_item("families", Value::list({Value::str(g.autoep_expert ? "autoep_expert" : "replicated")}));
    e->set_item("group_names", Value::list({Value::str(g.autoep_expert ? ep_group_name : "replicated")}));
    out->items.push_back(e);
  }
  return out;
}

std::vector<int> autoep_expert_dp_ranks(int ep_rank, int dp, int ep, bool data_before_expert) {
  std::vector<int> ranks(dp / ep, -1);
  for (int d = 0; d < dp; ++d) {
    const auto c = ep_coords(d, dp, ep, data_before_expert);
    if (c.ep_rank == ep_rank) ranks.at(c.edp_rank) = d;
  }
  return ranks;
}

std::string autoep_group_name(int ep) { return expert_group_name(ep); }

std::string autoep_expert_file_key(const std::string& prefix, const std::string& weight, int global_expert) {
  return prefix + "." + weight + "." + std::to_string(global_expert);
}

void check_autoep_expert_file(const ValuePtr& root, const std::string& path, const AutoEpLayer& a, int global_expert,
                              const std::map<std::string, std::vector<int64_t>>& fused) {
  if (!root || root->kind != Kind::Dict) fail(path, "not an expert state dict");
  std::set<std::string> want;
  for (const auto& w : autoep_weight_names()) want.insert(autoep_expert_file_key(a.expert_key_prefix, w, global_expert));
  for (const auto& [k, v] : root->entries) {
    if (!k || k->kind != Kind::Str) fail(path, "expert state dict has a non-string key");
    if (k->s == "folding") fail(path, "folded AutoEP+AutoTP expert shards are not supported (autoep_universal.py:201-207)");
    if (!want.erase(k->s))
      fail(path, "unexpected key " + k->s + " (expected " + a.expert_key_prefix + ".w1/w2/w3." + std::to_string(global_expert) + ")");
    if (!v || v->kind != Kind::Tensor) fail(path, k->s + " is not a tensor");
    std::vector<int64_t> local = fused.at(k->s.substr(a.expert_key_prefix.size() + 1, 2));
    local.erase(local.begin());
    if (v->tensor->shape() != local)
      fail(path, k->s + " has shape " + shape_str(v->tensor->shape()) + " but param_shapes gives " + shape_str(local) +
                     " per expert");
  }
  if (!want.empty()) fail(path, "missing key " + *want.begin());
}

void retarget_autoep_layers(const ValuePtr& layers, int ep, int dp, bool zero3, int ep_rank, int edp_rank) {
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
    set("ep_group_name", Value::str(expert_group_name(ep)));
    set("ep_rank", Value::integer(ep_rank));
    set("expert_data_parallel_rank", Value::integer(edp_rank));
    set("expert_data_parallel_world_size", Value::integer(dp / ep));
    set("global_expert_start", Value::integer(ep_rank * per));
    set("global_expert_end", Value::integer(ep_rank * per + per));
    set("checkpoint_format", Value::str(zero3 ? "zero3_partitioned" : "per_expert_files"));
    set("checkpoint_format_version", zero3 ? Value::integer(1) : Value::none());
  }
}

ValuePtr autoep_universal_state(const ValuePtr& param, int num_experts) {
  universal::StateFile f;
  f.param = param->as_tensor();
  f.cat_dim = 0;
  f.ep_num_experts = num_experts;
  return universal::to_pickle(f);
}

}  // namespace ucpkit::formats::deepspeed
