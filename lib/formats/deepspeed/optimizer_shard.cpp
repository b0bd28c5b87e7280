// DeepSpeed optimizer shards: read and write.
#include "formats/deepspeed/optimizer_shard.h"

#include "core/error.h"
#include "core/mapped_file.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/deepspeed/pickled_classes.h"
#include "io/torch/torch_file.h"

namespace ucpkit::formats::deepspeed {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string at_group(const char* key, size_t g) { return std::string(key) + "[" + std::to_string(g) + "]"; }

// The tensor `v` (`what` names it in the error).
Tensor tensor_of(const ValuePtr& v, const std::string& what, const std::string& path) {
  if (!v || v->kind != Kind::Tensor) fail(path, what + " is not a tensor");
  return v->as_tensor();
}

std::vector<OptimizerShard::Fragment> read_fragments(const ValuePtr& m, size_t g, const std::string& path) {
  std::vector<OptimizerShard::Fragment> out;
  if (!m || m->kind != Kind::Dict) fail(path, at_group("param_slice_mappings", g) + " is not a dict");
  for (const auto& [k, v] : m->entries) {
    if (k->kind != Kind::Str) fail(path, at_group("param_slice_mappings", g) + " has a key that is not a str");
    try {
      auto [numel, start] = v->as_fragment_address();
      out.push_back({k->s, start, numel});
    } catch (const Error& e) {
      fail(path, at_group("param_slice_mappings", g) + " of " + escaped_brief(k->s, 80) + ": " + e.what());
    }
  }
  return out;
}

// state[g] of the torch optimizer (a dict keyed by group index under ZeRO) into the groups; a key
// naming no group is state filed under the wrong group.
void read_states(const ValuePtr& state, OptimizerShard& s, const std::string& path) {
  if (!state || state->kind != Kind::Dict) return;
  const int64_t n = static_cast<int64_t>(s.groups.size());
  for (const auto& [k, v] : state->entries) {
    if (!k || k->kind != Kind::Int || k->i < 0 || k->i >= n)
      fail(path, "optimizer state is keyed under " + (k ? k->repr(1) : std::string("?")) + " but the shard has " +
                     std::to_string(n) + " param groups (0.." + std::to_string(n - 1) + ")");
    auto& g = s.groups[static_cast<size_t>(k->i)];
    g.has_state = v && v->kind == Kind::Dict;
    if (!g.has_state) continue;
    for (const auto& [name, x] : v->entries) {
      if (!name || name->kind != Kind::Str) continue;
      if (name->s == "step") g.step = x;
      else if (x && x->kind == Kind::Tensor) g.moments.emplace_back(name->s, x->as_tensor());
    }
  }
}

void read_param_groups(const ValuePtr& base, OptimizerShard& s) {
  ValuePtr pg = base && base->kind == Kind::Dict ? base->get("param_groups") : nullptr;
  if (pg && pg->is_sequence()) s.param_groups = pg->items;
}

void read_zero3(const ValuePtr& osd, OptimizerShard& s, const std::string& path) {
  s.flavor = OptimizerShard::Flavor::Zero3;
  for (const char* k : {"fp32_flat_groups", "optimizer_state_dict"})
    if (!osd->get(k)) fail(path, std::string("ZeRO-3 optimizer_state_dict has no ") + k);
  const auto flats = osd->get("fp32_flat_groups");
  if (!flats->is_sequence()) fail(path, "fp32_flat_groups is not a list");
  if (auto pc = osd->get("partition_count"); pc && pc->kind == Kind::Int) s.partition_count = static_cast<int>(pc->i);
  for (size_t g = 0; g < flats->items.size(); ++g) {
    auto& grp = s.groups.emplace_back();
    grp.fp32 = tensor_of(flats->items[g], at_group("fp32_flat_groups", g), path);
  }
  const auto inner = osd->get("optimizer_state_dict");
  read_states(inner->kind == Kind::Dict ? inner->get("state") : nullptr, s, path);
  read_param_groups(inner, s);
  s.partition_groups = parse_zero3_partition_groups(osd, path);
  if (auto pg = osd->get("ds_zero_partition_groups"); pg && pg->is_sequence())
    for (const auto& e : pg->items)
      if (auto names = e && e->kind == Kind::Dict ? e->get("group_names") : nullptr; names && names->is_sequence())
        for (const auto& n : names->items)
          if (n && n->kind == Kind::Str && n->s != "replicated") s.expert_group_name = n->s;
}

void read_zero12(const ValuePtr& osd, OptimizerShard& s, const std::string& path) {
  s.flavor = osd->get("zero_stage") ? OptimizerShard::Flavor::Zero12 : OptimizerShard::Flavor::Bf16Optimizer;
  for (const char* k : {"param_slice_mappings", "single_partition_of_fp32_groups", "base_optimizer_state"})
    if (!osd->get(k)) fail(path, std::string("optimizer_state_dict has no ") + k);
  const auto maps = osd->get("param_slice_mappings");
  const auto fp32 = osd->get("single_partition_of_fp32_groups");
  if (!maps->is_sequence()) fail(path, "param_slice_mappings is not a list");
  const auto pads = osd->get("group_paddings");
  const auto counts = osd->get("partition_count");
  for (size_t g = 0; g < maps->items.size(); ++g) {
    auto& grp = s.groups.emplace_back();
    grp.fragments = read_fragments(maps->items[g], g, path);
    if (!fp32->is_sequence() || g >= fp32->items.size())
      fail(path, "single_partition_of_fp32_groups has no group " + std::to_string(g));
    grp.fp32 = tensor_of(fp32->items[g], at_group("single_partition_of_fp32_groups", g), path);
    if (pads && pads->is_sequence() && g < pads->items.size()) {
      const auto& v = pads->items[g];
      if (!v || v->kind != Kind::Int || v->i < 0) fail(path, at_group("group_paddings", g) + " is not a count");
      grp.padding = v->i;
    }
    if (counts && counts->is_sequence() && g < counts->items.size())
      grp.partition_count = static_cast<int>(counts->items[g]->as_int());
    else if (counts && counts->kind == Kind::Int)
      grp.partition_count = static_cast<int>(counts->i);
  }
  const auto base = osd->get("base_optimizer_state");
  if (base->is_sequence()) {  // elastic: one state dict per group
    s.elastic = true;
    s.base_optimizer_state_step = osd->get("base_optimizer_state_step");
    auto as_dict = Value::dict();
    for (size_t g = 0; g < base->items.size() && g < s.groups.size(); ++g)
      as_dict->entries.emplace_back(Value::integer(static_cast<int64_t>(g)), base->items[g]);
    read_states(as_dict, s, path);
  } else {
    read_states(base->kind == Kind::Dict ? base->get("state") : nullptr, s, path);
    read_param_groups(base, s);
  }
  for (size_t g = 0; g < s.groups.size() && g < s.param_groups.size(); ++g) {
    const auto& pg = s.param_groups[g];
    if (!pg || pg->kind != Kind::Dict) continue;
    if (auto m = pg->get("moe"); m && m->kind == Kind::Bool && m->b) s.groups[g].moe = true;
    if (auto n = pg->get("name"); n && n->kind == Kind::Str)
      if (auto ep = ep_size_of_group_name(n->s)) s.groups[g].ep_size = *ep;
  }
}

ValuePtr state_of(const OptimizerShard::Group& g) {
  auto st = Value::dict();
  if (g.step) st->set_item("step", g.step);  // torch's Adam creates step first (optim/adam.py _init_group)
  for (const auto& [name, t] : g.moments) st->set_item(name, Value::of_tensor(t));
  return st;
}

ValuePtr states_of(const OptimizerShard& s) {
  auto state = Value::dict();
  for (size_t g = 0; g < s.groups.size(); ++g)
    if (s.groups[g].has_state)
      state->entries.emplace_back(Value::integer(static_cast<int64_t>(g)), state_of(s.groups[g]));
  return state;
}

// torch.optim.Optimizer.state_dict(): {state, param_groups}.
ValuePtr torch_optimizer_state(const OptimizerShard& s) {
  auto d = Value::dict();
  d->set_item("state", states_of(s));
  d->set_item("param_groups", Value::list(s.param_groups));
  return d;
}

void set_if(const ValuePtr& d, const char* key, const ValuePtr& v) {
  if (v) d->set_item(key, v);
}

// The loss-scaling keys every flavour but BF16_Optimizer saves together.
void set_loss_scaling(const ValuePtr& osd, const OptimizerShard& s) {
  set_if(osd, "loss_scaler", s.loss_scaler);
  set_if(osd, "dynamic_loss_scale", s.dynamic_loss_scale);
  set_if(osd, "overflow", s.overflow);
}

// stage3.py `_rigid_state_dict`.
ValuePtr zero3_to_pickle(const OptimizerShard& s) {
  auto osd = Value::dict(true);
  set_if(osd, "zero_stage", s.zero_stage);
  set_loss_scaling(osd, s);
  if (s.partition_count >= 0) osd->set_item("partition_count", Value::integer(s.partition_count));
  if (!s.partition_groups.empty())
    osd->set_item("ds_zero_partition_groups", zero3_partition_groups_value(s.partition_groups, s.expert_group_name));
  osd->set_item("optimizer_state_dict", torch_optimizer_state(s));
  auto flats = Value::list();
  for (const auto& g : s.groups) flats->items.push_back(Value::of_tensor(g.fp32));
  osd->set_item("fp32_flat_groups", flats);
  return osd;
}

// stage_1_and_2.py `_rigid_state_dict` and bf16_optimizer.py `state_dict`: the same keys in the same
// order, BF16_Optimizer without loss scaling and zero_stage (null fields are left out).
ValuePtr zero12_to_pickle(const OptimizerShard& s) {
  auto osd = Value::dict(true);
  set_loss_scaling(osd, s);
  set_if(osd, "clip_grad", s.clip_grad);
  if (s.elastic) {
    auto base = Value::list();
    for (const auto& g : s.groups) base->items.push_back(state_of(g));
    osd->set_item("base_optimizer_state", base);
    set_if(osd, "base_optimizer_state_step", s.base_optimizer_state_step);
  } else {
    osd->set_item("base_optimizer_state", torch_optimizer_state(s));
  }
  auto fp32 = Value::list(), pads = Value::list(), counts = Value::list(), maps = Value::list();
  bool padded = false, counted = false;
  for (const auto& g : s.groups) {
    fp32->items.push_back(Value::of_tensor(g.fp32));
    pads->items.push_back(Value::integer(g.padding));
    counts->items.push_back(Value::integer(g.partition_count));
    padded |= g.padding >= 0;
    counted |= g.partition_count >= 0;
    auto m = Value::dict(true);
    for (const auto& f : g.fragments) m->set_item(f.param, fragment_address(f.numel, f.start));
    maps->items.push_back(m);
  }
  osd->set_item("single_partition_of_fp32_groups", fp32);
  set_if(osd, "zero_stage", s.zero_stage);
  // A shard of no group records both lists, empty (nothing tells them apart from absent ones).
  if (padded || s.groups.empty()) osd->set_item("group_paddings", pads);
  if (counted || s.groups.empty()) osd->set_item("partition_count", counts);
  set_if(osd, "ds_version", s.ds_version);
  osd->set_item("param_slice_mappings", maps);
  return osd;
}

}  // namespace

OptimizerShard read_optimizer_shard(const ValuePtr& root, const std::string& path) {
  if (!root || root->kind != Kind::Dict) fail(path, "not an optimizer-states dict");
  const ValuePtr osd = root->get("optimizer_state_dict");
  if (!osd || osd->kind != Kind::Dict) fail(path, "no optimizer_state_dict (not a ZeRO optimizer shard)");
  OptimizerShard s;
  s.zero_stage = osd->get("zero_stage");
  s.loss_scaler = osd->get("loss_scaler");
  s.dynamic_loss_scale = osd->get("dynamic_loss_scale");
  s.overflow = osd->get("overflow");
  s.clip_grad = osd->get("clip_grad");
  s.ds_version = osd->get("ds_version");
  if (s.zero_stage && !s.zero_stage->is_none() && s.zero_stage->as_int() == 3) read_zero3(osd, s, path);
  else read_zero12(osd, s, path);
  return s;
}

OptimizerShard read_optimizer_shard(const TorchFile& file) {
  return read_optimizer_shard(file.root, file.file ? file.file->path() : std::string("<memory>"));
}

bool is_sharded_state(std::string_view key) {
  return key == "base_optimizer_state" || key == "param_slice_mappings" || key == "single_partition_of_fp32_groups";
}

ValuePtr saved_param_groups(const ValuePtr& osd) {
  if (!osd || osd->kind != Kind::Dict) return nullptr;
  auto base = osd->get("base_optimizer_state");
  if (!base) base = osd->get("optimizer_state_dict");  // ZeRO-3
  return base && base->kind == Kind::Dict ? base->get("param_groups") : nullptr;
}

std::vector<int> zero3_sub_group_owners(const std::vector<ValuePtr>& param_groups, size_t sub_groups,
                                        const std::string& path) {
  std::vector<int> owner(sub_groups, -1);
  for (size_t g = 0; g < param_groups.size(); ++g) {
    const auto& pg = param_groups[g];
    auto ids = pg && pg->kind == Kind::Dict ? pg->get("params") : nullptr;
    if (!ids || !ids->is_sequence()) fail(path, "param_groups[" + std::to_string(g) + "] has no params list");
    for (const auto& id : ids->items) {
      const int64_t sg = id ? id->as_int() : -1;
      if (sg < 0 || sg >= static_cast<int64_t>(sub_groups) || owner[static_cast<size_t>(sg)] >= 0)
        fail(path, "param_groups[" + std::to_string(g) + "] lists sub-group " + std::to_string(sg) + " but the model "
                   "file has " + std::to_string(sub_groups) + " (or it is listed twice)");
      owner[static_cast<size_t>(sg)] = static_cast<int>(g);
    }
  }
  for (size_t sg = 0; sg < sub_groups; ++sg)
    if (owner[sg] < 0) fail(path, "ZeRO-3 sub-group " + std::to_string(sg) + " is in no param group");
  return owner;
}

ValuePtr to_pickle(const OptimizerShard& shard) {
  return shard.zero3() ? zero3_to_pickle(shard) : zero12_to_pickle(shard);
}

pickle::ValuePtr optimizer_file_root(pickle::ValuePtr optimizer_state_dict, pickle::ValuePtr ds_config,
                                     pickle::ValuePtr ds_version) {
  auto root = pickle::Value::dict();
  root->set_item("optimizer_state_dict", std::move(optimizer_state_dict));
  root->set_item("ds_config", std::move(ds_config));
  root->set_item("ds_version", std::move(ds_version));
  return root;
}

std::optional<bool> shard_data_before_expert(const pickle::ValuePtr& file_root) {
  const auto cfg = pickle::entry_of(file_root, "ds_config");
  if (!cfg || cfg->kind != pickle::Kind::Dict) return std::nullopt;
  for (const char* key : {kUseDataBeforeExpertParallelism, "use_data_before_expert_parallel_"})
    if (auto f = cfg->get(key); f && f->kind == pickle::Kind::Bool) return f->b;
  return std::nullopt;
}

pickle::ValuePtr raw_optimizer_state_dict(const pickle::ValuePtr& file_root) { return pickle::entry_of(file_root, "optimizer_state_dict"); }
pickle::ValuePtr raw_loss_scaler(const pickle::ValuePtr& osd) { return pickle::entry_of(osd, "loss_scaler"); }
pickle::ValuePtr raw_clip_grad(const pickle::ValuePtr& osd) { return pickle::entry_of(osd, "clip_grad"); }
pickle::ValuePtr raw_overflow(const pickle::ValuePtr& osd) { return pickle::entry_of(osd, "overflow"); }

}  // namespace ucpkit::formats::deepspeed
