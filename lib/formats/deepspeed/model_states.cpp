// DeepSpeed model-states files (model_states.h): read into typed fields, written back as read or as
// one version line lays them out.
#include "formats/deepspeed/model_states.h"

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/module_tree.h"
#include "io/torch/torch_file.h"

namespace ucpkit::formats::deepspeed {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// param_shapes as DeepSpeed saves it: a list of OrderedDict(name -> torch.Size); nullopt for any
// other form (kept as an untyped entry so it is written back unchanged).
std::optional<ParamShapes> typed_param_shapes(const ValuePtr& v) {
  if (!v || v->kind != Kind::List) return std::nullopt;
  ParamShapes out;
  for (const auto& g : v->items) {
    if (!g || g->kind != Kind::Dict || !g->ordered || g->dict_state) return std::nullopt;
    auto& group = out.emplace_back();
    for (const auto& [k, s] : g->entries) {
      if (!k || k->kind != Kind::Str || !s || s->kind != Kind::Shape) return std::nullopt;
      group.emplace_back(k->s, s->shape);
    }
  }
  return out;
}

ValuePtr param_shapes_value(const ParamShapes& shapes) {
  auto list = Value::list();
  for (const auto& g : shapes) {
    auto d = Value::dict(true);
    for (const auto& [name, shape] : g) d->set_item(name, Value::torch_size(shape));
    list->items.push_back(d);
  }
  return list;
}

// A copy of the module's dicts (keys, tensors and other leaves shared) with `m.module`'s values put
// back by flat name. `own_state`: each dict's attribute state copied too, so _metadata can be added
// or dropped on the copy alone.
ValuePtr module_with_values(const ModelStates& m, bool own_state) {
  if (!m.tree) return nullptr;  // module None: a pipeline's mp_rank file (the layers have files of their own)
  const std::map<std::string, ValuePtr> values(m.module.begin(), m.module.end());
  std::unordered_map<const Value*, ValuePtr> seen;  // a dict saved once stays one object
  std::function<ValuePtr(const ValuePtr&, const std::string&)> copy = [&](const ValuePtr& d, const std::string& path) {
    if (auto it = seen.find(d.get()); it != seen.end()) return it->second;
    auto c = std::make_shared<Value>(*d);
    seen[d.get()] = c;
    if (own_state && c->dict_state) c->dict_state = std::make_shared<Value>(*c->dict_state);
    for (auto& [k, v] : c->entries) {
      if (!k || k->kind != Kind::Str || !v) continue;
      const std::string name = path.empty() ? k->s : path + "." + k->s;
      if (v->kind == Kind::Dict) {
        v = copy(v, name);
      } else if (v->kind == Kind::Tensor) {
        if (auto it = values.find(name); it != values.end()) v = it->second;
      }
    }
    return c;
  };
  return copy(m.tree, "");
}

// The value of a key that has a typed field; nullptr when the field is empty.
ValuePtr field_value(const ModelStates& m, const std::string& key, const ValuePtr& module) {
  if (key == "module") return module;
  if (key == "param_shapes") return m.param_shapes ? param_shapes_value(*m.param_shapes) : nullptr;
  if (key == "dp_world_size") return m.dp_world_size ? Value::integer(*m.dp_world_size) : nullptr;
  if (key == "mp_world_size") return m.mp_world_size ? Value::integer(*m.mp_world_size) : nullptr;
  if (key == "ds_config") return m.ds_config;
  if (key == "ds_version") return m.ds_version ? Value::str(*m.ds_version) : nullptr;
  return nullptr;
}

bool is_field(const std::string& key) {
  return key == "module" || key == "param_shapes" || key == "dp_world_size" || key == "mp_world_size" ||
         key == "ds_config" || key == "ds_version";
}

// The ZeRO stage the target's ds_config names (DeepSpeed's default 0 when it names none).
int zero_stage_of(const ValuePtr& cfg) {
  if (cfg && cfg->kind == Kind::Dict)
    if (auto z = cfg->get("zero_optimization"); z && z->kind == Kind::Dict)
      if (auto st = z->get("stage"); st && st->kind == Kind::Int) return static_cast<int>(st->i);
  return 0;
}

constexpr const char* kFrozenParamKeys[] = {"frozen_param_shapes", "frozen_param_fragments"};

// save_frozen_param = partition_gradients (ZeRO >= 2, engine.py v0.19.5:5097): {} or None.
ValuePtr frozen_params_value(int zero_stage) { return zero_stage >= 2 ? Value::dict(true) : Value::none(); }

// What `line`'s save code writes under a DeepSpeed key the model does not have.
ValuePtr line_default(const ModelStates& m, const std::string& key) {
  if (key == kCheckpointParallelDims) {  // native MoE targets are TP = PP = 1 (engine.py:238-246)
    auto d = Value::dict();
    d->set_item("pp_degree", Value::integer(1));
    d->set_item("tp_degree", Value::integer(1));
    return d;
  }
  if (key == "buffer_names") return Value::list();
  if (key == "shared_params") return Value::dict();
  for (const char* k : kFrozenParamKeys)
    if (key == k) return frozen_params_value(zero_stage_of(m.ds_config));
  return Value::none();  // optimizer, ds_autoep_layers, data_sampler, random_ltd, param_shapes, ds_config
}

}  // namespace

ValuePtr ModelStates::get(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return v;
  return nullptr;
}

bool ModelStates::contains(const std::string& key) const {
  return std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == key; });
}

void ModelStates::set(const std::string& key, ValuePtr value) {
  for (auto& [k, v] : entries)
    if (k == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(key, std::move(value));
}

std::vector<std::pair<std::string, ValuePtr>> ModelStates::client_state() const {
  std::vector<std::pair<std::string, ValuePtr>> out;
  for (const auto& e : entries)
    if (!is_deepspeed_model_key(e.first)) out.push_back(e);
  return out;
}

ModelStates read_model_states(const ValuePtr& root, const std::string& path) {
  if (!root || root->kind != Kind::Dict) fail(path, "not a model-states dict");
  ModelStates m;
  m.ordered = root->ordered;
  if (!root->contains("module")) {  // a layer or expert file: a bare state dict
    m.module_only = true;
    m.tree = root;
    m.module = module_tensors(root);
    return m;
  }
  for (const auto& [k, v] : root->entries) {
    if (!k || k->kind != Kind::Str) fail(path, "model-states dict has a key that is not a string");
    const std::string& key = k->s;
    bool typed = true;
    if (key == "module" && v && v->kind == Kind::Dict) {
      m.tree = v;
      m.module = module_tensors(v);
    } else if (key == "param_shapes" && (m.param_shapes = typed_param_shapes(v))) {
    } else if ((key == "dp_world_size" || key == "mp_world_size") && v && v->kind == Kind::Int) {
      (key == "dp_world_size" ? m.dp_world_size : m.mp_world_size) = v->i;
    } else if (key == "ds_config" && v && !v->is_none()) {
      m.ds_config = v;
    } else if (key == "ds_version" && v && v->kind == Kind::Str) {
      m.ds_version = v->s;
    } else {
      typed = false;
    }
    m.entries.emplace_back(key, typed ? nullptr : v);
  }
  return m;
}

ModelStates read_model_states(const TorchFile& file, const std::string& path) { return read_model_states(file.root, path); }

ModelStates read_rank_model_states(const ValuePtr& root, const std::string& path) {
  ModelStates m = read_model_states(root, path);
  if (m.module_only) fail(path, "not a model-states dict: it has no 'module' entry");
  return m;
}

ValuePtr to_pickle(const ModelStates& m) {
  const ValuePtr module = module_with_values(m, false);
  if (m.module_only) return module;
  auto out = Value::dict(m.ordered);
  for (const auto& [k, v] : m.entries) {
    ValuePtr value = is_field(k) ? field_value(m, k, module) : nullptr;  // a field set wins over what was read
    if (!value) value = v;
    if (value) out->entries.emplace_back(Value::str(k), value);
  }
  return out;
}

ValuePtr to_pickle(const ModelStates& m, const VersionLine& line) {
  if (m.module_only) return to_pickle(m);
  const ValuePtr module = module_with_values(m, true);
  if (line.module_metadata) {
    const std::string enc = "language_model.encoder.";
    std::vector<std::string> popped;  // Megatron pops the expert keys after encoder.state_dict() ran
    for (const auto& n : m.expert_param_names)
      if (n.rfind(enc, 0) == 0) popped.push_back(n.substr(enc.size()));
    add_module_metadata(module, {{"language_model.encoder", popped}});
  } else {
    drop_module_metadata(module);
  }
  auto out = Value::dict(m.ordered);
  for (const auto& key : line.mp_rank_keys) {
    ValuePtr v;
    if (key == "ds_version") {
      const bool of_line = m.ds_version && moe_line_of_release(*m.ds_version) == line.name;
      v = Value::str(of_line ? *m.ds_version : line.ds_version);
    } else {
      v = is_field(key) ? field_value(m, key, module) : nullptr;
      if (!v) v = m.get(key);
    }
    out->set_item(key, v ? v : line_default(m, key));
  }
  for (const auto& [k, v] : m.entries)
    if (!is_deepspeed_model_key(k)) out->entries.emplace_back(Value::str(k), v);  // client state, in file order
  return out;
}

std::vector<ValuePtr> bit16_group_tensors(bool compact_copies, const std::vector<GroupMember>& members,
                                          const std::function<Tensor(size_t)>& compact,
                                          const std::function<std::shared_ptr<Storage>()>& flat) {
  std::vector<ValuePtr> out;
  if (members.empty()) return out;
  if (compact_copies) {
    for (size_t k = 0; k < members.size(); ++k) out.push_back(Value::of_tensor(compact(k)));
    return out;
  }
  const std::shared_ptr<Storage> storage = flat();
  for (const auto& p : members)
    out.push_back(Value::of_tensor(Tensor(storage, p.offset, p.shape, Tensor::contiguous_strides(p.shape))));
  return out;
}

ValuePtr retarget_ds_config(const ValuePtr& source, const LayoutFacts& t) {
  if (!source || source->kind != Kind::Dict) return source;
  auto cfg = pickle::deep_copy(source);
  // AutoEP: expert_parallel.autoep_size is the EP size (engine.py v0.19.5:562).
  if (auto ep = cfg->get("expert_parallel"); t.autoep && ep && ep->kind == Kind::Dict && ep->contains("autoep_size"))
    ep->set_item("autoep_size", Value::integer(t.ep));
  if (auto z = cfg->get("zero_optimization"); z && z->kind == Kind::Dict) {
    z->set_item("stage", Value::integer(t.zero_stage));
    // sub_group_size is a ZeRO-3 setting: the one used at stage 3, none below (a ZeRO-3 source's).
    if (t.zero_stage == 3) z->set_item("sub_group_size", Value::integer(t.sub_group_size));
    else z->erase("sub_group_size");
  }
  if (auto b = cfg->get("bf16"); b && b->kind == Kind::Dict) b->set_item("enabled", Value::boolean(t.dtype == DType::BFloat16));
  if (auto f = cfg->get("fp16"); f && f->kind == Kind::Dict) f->set_item("enabled", Value::boolean(t.dtype == DType::Float16));
  if (auto tb = cfg->get("train_batch_size"); tb && tb->kind == Kind::Int && t.source_dp > 0 && tb->i % t.source_dp == 0)
    cfg->set_item("train_batch_size", Value::integer(tb->i / t.source_dp * t.dp));
  return cfg;
}

void retarget_megatron_args(const ValuePtr& args, const LayoutFacts& t) {
  if (!args || args->kind != Kind::Object) return;
  auto set = [&](const char* field, ValuePtr v) {
    if (args->attr(field)) args->set_attr(field, std::move(v));
  };
  set("tensor_model_parallel_size", Value::integer(t.tp));
  set("pipeline_model_parallel_size", Value::integer(t.pp));
  set("data_parallel_size", Value::integer(t.dp));
  set("world_size", Value::integer(static_cast<int64_t>(t.tp) * t.pp * t.dp));
  set("zero_stage", Value::integer(t.zero_stage));
  set("moe_expert_parallel_size", Value::integer(t.ep));
  if (t.padded_vocab > 0) set("padded_vocab_size", Value::integer(t.padded_vocab));
  set("params_dtype", Value::torch_dtype(t.dtype));
  set("fp16", Value::boolean(t.dtype == DType::Float16));
  set("bf16", Value::boolean(t.dtype == DType::BFloat16));
}

void retarget_layout(ModelStates& m, const LayoutFacts& t, int mp_world_size) {
  if (m.contains("dp_world_size")) m.dp_world_size = t.dp;
  if (m.contains("mp_world_size")) m.mp_world_size = mp_world_size;
  if (auto cpd = m.get(kCheckpointParallelDims); cpd && cpd->kind == Kind::Dict) {
    cpd->set_item("pp_degree", Value::integer(t.pp));
    cpd->set_item("tp_degree", Value::integer(t.tp));
  }
  if (m.ds_config) m.ds_config = retarget_ds_config(m.ds_config, t);
  retarget_megatron_args(m.args(), t);
  if (auto uc = m.get("universal_checkpoint_info"); uc && uc->kind == Kind::Dict && t.padded_vocab > 0 &&
                                                      uc->contains("padded_vocab_size"))
    uc->set_item("padded_vocab_size", Value::integer(t.padded_vocab));
}

void retarget_autoep(ModelStates& m, const LayoutFacts& t, int ep_rank, int expert_dp_rank) {
  const bool zero3 = t.zero_stage == 3;
  retarget_autoep_layers(m.get("ds_autoep_layers"), t.ep, t.dp, zero3, ep_rank, expert_dp_rank);
  if (auto uc = m.get("universal_checkpoint_info"); uc && uc->kind == Kind::Dict)
    retarget_autoep_layers(uc->get("ds_autoep_layers"), t.ep, t.dp, zero3, ep_rank, expert_dp_rank);
  add_frozen_params(m, t.zero_stage);
}

void add_frozen_params(ModelStates& m, int zero_stage) {
  // Missing, or of the source's stage where the target's differs (a ZeRO-1 template has None, a ZeRO-3
  // one {}): the target stage decides, as save_frozen_param does (engine.py v0.19.6:5163, :4902-4905).
  for (const char* k : kFrozenParamKeys)
    if (auto v = m.get(k); !v || (zero_stage >= 2) != (v->kind == Kind::Dict)) m.set(k, frozen_params_value(zero_stage));
}

ValuePtr minimal_moe_ds_config(int zero_stage, bool bf16, bool fp16, bool data_before_expert) {
  auto cfg = Value::dict();
  auto z = Value::dict();
  z->set_item("stage", Value::integer(zero_stage));
  cfg->set_item("zero_optimization", z);
  auto bf = Value::dict();
  bf->set_item("enabled", Value::boolean(bf16));
  cfg->set_item("bf16", bf);
  auto fp = Value::dict();
  fp->set_item("enabled", Value::boolean(fp16));
  cfg->set_item("fp16", fp);
  if (data_before_expert) cfg->set_item(kUseDataBeforeExpertParallelism, Value::boolean(true));
  return cfg;
}

std::vector<std::pair<std::string, std::string>> shared_params(const ModelStates& m) {
  std::vector<std::pair<std::string, std::string>> out;
  if (auto d = m.get("shared_params"); d && d->kind == Kind::Dict)
    for (const auto& [k, v] : d->entries)
      if (k && k->kind == Kind::Str && v && v->kind == Kind::Str) out.emplace_back(k->s, v->s);
  return out;
}

ModelStates fresh_engine_model_states(const ParamShapes& shapes, DType dtype, int zero_stage, const std::string& ds_version,
                                      const std::vector<std::pair<std::string, std::string>>& tied) {
  ModelStates m;
  m.ordered = false;
  m.tree = Value::dict(true);  // module.state_dict(): an OrderedDict of the parameters
  auto add = [&](const std::string& name) {
    auto placeholder = Value::of_tensor(Tensor(Storage::zeros(dtype, 0), 0, {0}, {1}));
    m.tree->set_item(name, placeholder);
    m.module.emplace_back(name, placeholder);
  };
  for (const auto& group : shapes)
    for (const auto& entry : group) add(entry.first);
  auto shared = Value::dict();
  for (const auto& [alias, param] : tied) {
    add(alias);
    shared->set_item(alias, Value::str(param));
  }
  m.param_shapes = shapes;
  m.dp_world_size = 1;
  m.mp_world_size = 1;
  m.ds_config = minimal_moe_ds_config(zero_stage, dtype == DType::BFloat16, dtype == DType::Float16, false);
  m.ds_version = ds_version;
  auto parallel = Value::dict();
  parallel->set_item("pp_degree", Value::integer(1));
  parallel->set_item("tp_degree", Value::integer(1));
  const std::pair<const char*, ValuePtr> keys[] = {
      {"module", nullptr}, {"buffer_names", Value::list()}, {"optimizer", Value::none()}, {"param_shapes", nullptr},
      {"frozen_param_shapes", Value::none()}, {"shared_params", shared}, {"frozen_param_fragments", Value::none()},
      {"lr_scheduler", Value::none()}, {"data_sampler", Value::none()}, {"random_ltd", Value::none()},
      {"skipped_steps", Value::integer(0)}, {"global_steps", Value::integer(0)}, {"global_samples", Value::integer(0)},
      {"dp_world_size", nullptr}, {"mp_world_size", nullptr}, {"checkpoint_parallel_dimensions", parallel},
      {"ds_config", nullptr}, {"ds_version", nullptr}};
  for (const auto& [k, v] : keys) m.entries.emplace_back(k, v);
  return m;
}

std::vector<std::pair<std::string, int64_t>> recorded_steps(const ModelStates& m) {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const char* key : {"global_steps", "iteration"})
    if (auto v = m.get(key); v && v->is(pickle::Kind::Int) && v->i >= 0) out.emplace_back(key, v->i);
  return out;
}

std::string ds_version_of(const pickle::ValuePtr& root) {
  const auto v = raw_ds_version(root);
  return v && v->kind == pickle::Kind::Str ? v->s : "";
}

pickle::ValuePtr raw_param_shapes(const pickle::ValuePtr& root) { return pickle::entry_of(root, "param_shapes"); }
pickle::ValuePtr raw_ds_config(const pickle::ValuePtr& root) { return pickle::entry_of(root, "ds_config"); }
pickle::ValuePtr raw_dp_world_size(const pickle::ValuePtr& root) { return pickle::entry_of(root, "dp_world_size"); }
pickle::ValuePtr raw_mp_world_size(const pickle::ValuePtr& root) { return pickle::entry_of(root, "mp_world_size"); }
pickle::ValuePtr raw_ds_version(const pickle::ValuePtr& root) { return pickle::entry_of(root, "ds_version"); }
bool had_param_shapes(const ModelStates& m) { return m.contains("param_shapes"); }
bool had_ds_config(const ModelStates& m) { return m.contains("ds_config"); }

pickle::ValuePtr universal_checkpoint_info(const ModelStates& m) { return m.get("universal_checkpoint_info"); }

std::vector<int> num_experts(const ModelStates& m) {
  std::vector<int> out;
  if (auto ne = m.get("num_experts"); ne && ne->is_sequence())
    for (const auto& x : ne->items) out.push_back(static_cast<int>(x->as_int()));
  return out;
}

bool has_autoep_layers(const ModelStates& m) {
  const auto a = m.get("ds_autoep_layers");
  return a && !a->is_none();
}

std::vector<AutoEpLayer> autoep_layers(const ModelStates& m, const std::string& path) {
  if (!has_autoep_layers(m)) return {};
  return parse_autoep_layers(m.get("ds_autoep_layers"), path);
}

std::optional<bool> autoep_data_before_expert(const ModelStates& m, const std::string& path) {
  if (!m.ds_config || m.ds_config->kind != Kind::Dict) return std::nullopt;
  const auto f = m.ds_config->get(kUseDataBeforeExpertParallelism);
  if (!f) return std::nullopt;
  if (f->kind != Kind::Bool) fail(path, std::string("ds_config.") + kUseDataBeforeExpertParallelism + " is not a boolean");
  return f->b;
}

std::optional<SavedParamShapes> saved_param_shapes(const ModelStates& m) {
  SavedParamShapes out;
  if (m.param_shapes) {
    out.groups = *m.param_shapes;
    return out;
  }
  const ValuePtr ps = m.get("param_shapes");
  auto group_of = [](const ValuePtr& g) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> row;
    for (const auto& [k, v] : g->entries) row.emplace_back(k->as_str(), v->as_shape());
    return row;
  };
  if (ps && ps->is_sequence()) {
    for (const auto& g : ps->items) {
      if (g && g->kind == Kind::Dict) out.groups.push_back(group_of(g));
      else ++out.not_dicts;
    }
    return out;
  }
  if (ps && ps->kind == Kind::Dict) {
    out.groups.push_back(group_of(ps));
    out.one_dict = true;
    return out;
  }
  return std::nullopt;
}

void check_recorded_parallel_sizes(const ModelStates& m, const std::string& path, int tp, int pp) {
  if (m.mp_world_size && *m.mp_world_size != tp && *m.mp_world_size != static_cast<int64_t>(tp) * pp)
    fail(path, "inconsistent world sizes: mp_world_size is " + std::to_string(*m.mp_world_size) +
                   " but the files say tp=" + std::to_string(tp));
  if (auto args = m.args(); args && args->kind == Kind::Object) {
    auto check = [&](const char* field, int expect) {
      if (auto a = args->attr(field); a && a->kind == Kind::Int && a->i != expect)
        fail(path, std::string("inconsistent world sizes: args.") + field + " is " + std::to_string(a->i) +
                       " but the files say " + std::to_string(expect));
    };
    check("tensor_model_parallel_size", tp);
    check("pipeline_model_parallel_size", pp);
  }
}

}  // namespace ucpkit::formats::deepspeed
