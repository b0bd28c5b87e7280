// Megatron's nested module dict: flat names, tensor replacement, torch's _metadata.
#include "formats/deepspeed/module_tree.h"

#include <set>

namespace ucpkit::formats::deepspeed {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string dotted(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

template <class F>
void walk_dicts(const ValuePtr& d, const std::string& path, F&& f) {
  if (!d || d->kind != Kind::Dict) return;
  f(d, path);
  for (const auto& [k, v] : d->entries)
    if (v && v->kind == Kind::Dict && k && k->kind == Kind::Str) walk_dicts(v, dotted(path, k->s), f);
}

}  // namespace

std::vector<std::pair<std::string, ValuePtr>> module_tensors(const ValuePtr& module) {
  std::vector<std::pair<std::string, ValuePtr>> out;
  walk_dicts(module, "", [&](const ValuePtr& d, const std::string& path) {
    for (const auto& [k, v] : d->entries)
      if (v && v->kind == Kind::Tensor && k && k->kind == Kind::Str) out.emplace_back(dotted(path, k->s), v);
  });
  return out;
}

bool module_is_nested(const ValuePtr& module) {
  if (!module || module->kind != Kind::Dict) return false;
  for (const auto& [k, v] : module->entries)
    if (v && v->kind == Kind::Dict) return true;
  return false;
}

bool module_has_metadata(const ValuePtr& module) {
  bool any = false;
  walk_dicts(module, "", [&](const ValuePtr& d, const std::string&) {
    if (d->dict_state && d->dict_state->kind == Kind::Dict && d->dict_state->contains("_metadata")) any = true;
  });
  return any;
}

void replace_module_tensors(const ValuePtr& module,
                            const std::function<ValuePtr(const std::string&, const ValuePtr&)>& replace) {
  walk_dicts(module, "", [&](const ValuePtr& d, const std::string& path) {
    for (auto& [k, v] : d->entries)
      if (v && v->kind == Kind::Tensor && k && k->kind == Kind::Str)
        if (auto n = replace(dotted(path, k->s), v)) v = n;
  });
}

// Megatron's nested module (GPTModel.state_dict_for_save_checkpoint: {'language_model': {'embedding':
// {'word_embeddings': {'weight'}}, 'encoder': {'layers.0....'}}}, Megatron-DeepSpeed
// megatron/model/gpt_model.py:266-283, language_model.py:269-285, :603-645).
static ValuePtr with_leaves(const ValuePtr& tree, const std::string& prefix, std::map<std::string, ValuePtr>& fresh) {
  auto out = Value::dict(tree->ordered);
  out->dict_state = tree->dict_state;
  for (const auto& [k, v] : tree->entries) {
    const std::string path = k->kind == Kind::Str ? dotted(prefix, k->s) : std::string();
    if (v && v->kind == Kind::Dict && !path.empty()) {
      out->entries.emplace_back(k, with_leaves(v, path, fresh));
      continue;
    }
    auto it = path.empty() ? fresh.end() : fresh.find(path);
    if (it != fresh.end()) {
      out->entries.emplace_back(k, it->second);
      fresh.erase(it);
    } else {
      out->entries.emplace_back(k, v);  // buffers and other non-trainable entries travel as they are
    }
  }
  return out;
}

ValuePtr with_module_leaves(const ValuePtr& module, std::map<std::string, ValuePtr>& fresh) {
  return with_leaves(module, "", fresh);
}

void insert_module_leaf(const ValuePtr& module, const std::string& name, ValuePtr value) {
  ValuePtr at = module;
  std::string rest = name;
  for (bool descended = true; descended;) {
    descended = false;
    for (const auto& [k, v] : at->entries)
      if (v && v->kind == Kind::Dict && k->kind == Kind::Str && rest.size() > k->s.size() &&
          rest.compare(0, k->s.size(), k->s) == 0 && rest[k->s.size()] == '.') {
        rest = rest.substr(k->s.size() + 1);
        at = v;
        descended = true;
        break;
      }
  }
  at->set_item(rest, std::move(value));
}

void drop_module_metadata(const ValuePtr& module) {
  walk_dicts(module, "", [&](const ValuePtr& d, const std::string&) {
    if (!d->dict_state || d->dict_state->kind != Kind::Dict) return;
    d->dict_state->erase("_metadata");
    if (d->dict_state->entries.empty()) d->dict_state = nullptr;
  });
}

// How many leading dotted components two keys share.
static size_t shared_components(const std::string& a, const std::string& b) {
  size_t n = 0, i = 0;
  for (; i < a.size() && i < b.size() && a[i] == b[i]; ++i)
    if (a[i] == '.') ++n;
  return n;
}

// Puts each popped key back where state_dict() had it: after the last key sharing the most module
// path with it (the popped experts of deepspeed_moe follow its gate, MOELayer registers gate before
// experts, moe/sharded_moe.py), so the prefixes come out in torch's module pre-order.
static void place_popped_keys(std::vector<std::string>& keys, const std::vector<std::string>& popped) {
  for (const auto& key : popped) {
    size_t best = 0, at = keys.size();
    for (size_t i = 0; i < keys.size(); ++i)
      if (const size_t n = shared_components(keys[i], key); n > 0 && n >= best) best = n, at = i + 1;
    keys.insert(keys.begin() + static_cast<std::ptrdiff_t>(at), key);
  }
}

void add_module_metadata(const ValuePtr& module,
                         const std::vector<std::pair<std::string, std::vector<std::string>>>& extra_keys) {
  walk_dicts(module, "", [&](const ValuePtr& d, const std::string& path) {
    if (!d->ordered) return;  // Megatron's own levels are plain dicts; torch's state_dicts are OrderedDicts
    if (d->dict_state && d->dict_state->kind == Kind::Dict && d->dict_state->contains("_metadata")) return;
    std::vector<std::string> keys;
    for (const auto& [k, v] : d->entries)
      if (v && v->kind == Kind::Tensor && k && k->kind == Kind::Str) keys.push_back(k->s);
    if (keys.empty()) return;
    for (const auto& [p, extra] : extra_keys)
      if (p == path) place_popped_keys(keys, extra);
    // torch Module.state_dict: _metadata[prefix[:-1]] = {'version': cls._version} per module, pre-order.
    auto meta = Value::dict(true);
    std::set<std::string> seen;
    auto add = [&](const std::string& prefix) {
      if (!seen.insert(prefix).second) return;
      auto v = Value::dict();
      v->set_item("version", Value::integer(1));
      meta->set_item(prefix, v);
    };
    add("");
    for (const auto& key : keys) {
      for (size_t dot = key.find('.'); dot != std::string::npos; dot = key.find('.', dot + 1)) add(key.substr(0, dot));
    }
    if (!d->dict_state) d->dict_state = Value::dict();
    d->dict_state->set_item("_metadata", meta);
  });
}

}  // namespace ucpkit::formats::deepspeed
