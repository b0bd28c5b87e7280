// The value tree.
#include "io/pickle/value.h"

#include <cmath>
#include <functional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/node_pool.h"

namespace ucpkit::pickle {
namespace {
ValuePtr make(Kind k) {
  auto v = make_node<Value>();
  v->kind = k;
  return v;
}
}  // namespace

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::None: return "None";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::BigInt: return "int (big)";
    case Kind::Float: return "float";
    case Kind::Str: return "str";
    case Kind::Bytes: return "bytes";
    case Kind::List: return "list";
    case Kind::Tuple: return "tuple";
    case Kind::Dict: return "dict";
    case Kind::Set: return "set";
    case Kind::FrozenSet: return "frozenset";
    case Kind::Shape: return "torch.Size";
    case Kind::Dtype: return "torch.dtype";
    case Kind::Tensor: return "tensor";
    case Kind::Global: return "global";
    case Kind::Object: return "object";
  }
  return "?";
}

ValuePtr Value::none() { return make(Kind::None); }
ValuePtr Value::boolean(bool v) {
  auto r = make(Kind::Bool);
  r->b = v;
  return r;
}
ValuePtr Value::integer(int64_t v) {
  auto r = make(Kind::Int);
  r->i = v;
  return r;
}
ValuePtr Value::real(double v) {
  auto r = make(Kind::Float);
  r->f = v;
  return r;
}
ValuePtr Value::str(std::string v) {
  auto r = make(Kind::Str);
  r->s = std::move(v);
  return r;
}
ValuePtr Value::bytes(std::string v) {
  auto r = make(Kind::Bytes);
  r->s = std::move(v);
  return r;
}
ValuePtr Value::list(std::vector<ValuePtr> items) {
  auto r = make(Kind::List);
  r->items = std::move(items);
  return r;
}
ValuePtr Value::tuple(std::vector<ValuePtr> items) {
  auto r = make(Kind::Tuple);
  r->items = std::move(items);
  return r;
}
ValuePtr Value::dict(bool ordered) {
  auto r = make(Kind::Dict);
  r->ordered = ordered;
  return r;
}
ValuePtr Value::set(std::vector<ValuePtr> items) {
  auto r = make(Kind::Set);
  r->items = std::move(items);
  return r;
}
ValuePtr Value::torch_size(std::vector<int64_t> dims) {
  auto r = make(Kind::Shape);
  r->shape = std::move(dims);
  return r;
}
ValuePtr Value::torch_dtype(DType t) {
  auto r = make(Kind::Dtype);
  r->dtype = t;
  return r;
}
ValuePtr Value::of_tensor(ucpkit::Tensor t) {
  auto r = make(Kind::Tensor);
  r->tensor = std::make_shared<ucpkit::Tensor>(std::move(t));
  return r;
}
ValuePtr Value::global(std::string module, std::string name) {
  auto r = make(Kind::Global);
  r->s = std::move(module);
  r->name = std::move(name);
  return r;
}
ValuePtr Value::make_object(std::string module, std::string name, ValuePtr args, ValuePtr state,
                            Object::Build build) {
  auto r = make(Kind::Object);
  r->object = make_node<Object>();
  r->object->callable = global(std::move(module), std::move(name));
  r->object->args = args ? std::move(args) : tuple();
  r->object->state = std::move(state);
  r->object->build = build;
  return r;
}

std::string Value::class_path() const {
  if (kind == Kind::Global) return s + "." + name;
  if (kind != Kind::Object || !object || !object->callable) return std::string(kind_name(kind));
  const Value& c = *object->callable;
  std::string path = c.kind == Kind::Global ? c.s + "." + c.name : std::string("?");
  // copyreg helpers carry the real class as their first argument.
  // Enum members pickled as getattr(cls, name) (Python 3.11+) report their enum class.
  if ((path == "builtins.getattr" || path == "__builtin__.getattr") &&
      object->args && !object->args->items.empty() && object->args->items[0]->kind == Kind::Global)
    return object->args->items[0]->class_path();
  if ((path == "copyreg.__newobj__" || path == "copyreg._reconstructor" || path == "copy_reg._reconstructor") &&
      object->args && !object->args->items.empty() && object->args->items[0]->kind == Kind::Global)
    return object->args->items[0]->class_path();
  return path;
}

ValuePtr Value::get(std::string_view key) const {
  if (kind != Kind::Dict) return nullptr;
  for (const auto& [k, v] : entries)
    if (k->kind == Kind::Str && k->s == key) return v;
  return nullptr;
}

const ValuePtr& Value::at(std::string_view key) const {
  if (kind != Kind::Dict) throw Error("expected a dict holding '" + std::string(key) + "', found " + std::string(kind_name(kind)));
  for (const auto& e : entries)
    if (e.first->kind == Kind::Str && e.first->s == key) return e.second;
  throw Error("missing key '" + std::string(key) + "'");
}

void Value::set_item(std::string_view key, ValuePtr v) {
  if (kind != Kind::Dict) throw Error("set_item on a " + std::string(kind_name(kind)));
  for (auto& e : entries)
    if (e.first->kind == Kind::Str && e.first->s == key) {
      e.second = std::move(v);
      return;
    }
  entries.emplace_back(str(std::string(key)), std::move(v));
}

bool Value::erase(std::string_view key) {
  for (auto it = entries.begin(); it != entries.end(); ++it)
    if (it->first->kind == Kind::Str && it->first->s == key) {
      entries.erase(it);
      return true;
    }
  return false;
}

namespace {
// The attribute dict of an object's state: a dict, or (dict, slots) as for objects with __slots__.
Value* state_dict(const Value& v) {
  if (v.kind != Kind::Object || !v.object->state) return nullptr;
  Value* st = v.object->state.get();
  if (st->kind == Kind::Dict) return st;
  if (st->kind == Kind::Tuple && st->items.size() == 2) {
    for (auto& part : st->items)
      if (part->kind == Kind::Dict) return part.get();
  }
  return nullptr;
}
}  // namespace

ValuePtr Value::attr(std::string_view attr_name) const {
  if (kind != Kind::Object) return nullptr;
  if (kind == Kind::Object && object->state && object->state->kind == Kind::Tuple) {
    for (auto& part : object->state->items)
      if (auto r = part->get(attr_name)) return r;
    return nullptr;
  }
  Value* d = state_dict(*this);
  return d ? d->get(attr_name) : nullptr;
}

void Value::set_attr(std::string_view attr_name, ValuePtr v) {
  if (kind != Kind::Object) throw Error("set_attr on a " + std::string(kind_name(kind)));
  if (!object->state) object->state = dict();
  Value* d = state_dict(*this);
  if (!d) throw Error("object " + class_path() + " has no attribute dict");
  d->set_item(attr_name, std::move(v));
}

int64_t Value::as_int() const {
  switch (kind) {
    case Kind::Int: return i;
    case Kind::Bool: return b ? 1 : 0;
    case Kind::BigInt: {
      if (s.size() > 8) throw Error("integer does not fit in 64 bits");
      uint64_t u = 0;
      for (size_t k = 0; k < s.size(); ++k) u |= static_cast<uint64_t>(static_cast<uint8_t>(s[k])) << (8 * k);
      if (!s.empty() && s.size() < 8 && (static_cast<uint8_t>(s.back()) & 0x80))
        u |= ~uint64_t{0} << (8 * s.size());
      return static_cast<int64_t>(u);
    }
    case Kind::Object: {
      // int enums (ZeroStageEnum) are rebuilt as cls(value) (Python < 3.11) or getattr(cls, name).
      const auto& a = object->args;
      if (a && a->kind == Kind::Tuple && a->items.size() == 1 && object->callable->kind == Kind::Global)
        return a->items[0]->as_int();
      if (a && a->kind == Kind::Tuple && a->items.size() == 2 && a->items[1]->kind == Kind::Str &&
          class_path() == "deepspeed.runtime.zero.config.ZeroStageEnum") {
        static const std::pair<std::string_view, int> members[] = {
            {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
        for (const auto& [n, v] : members)
          if (a->items[1]->s == n) return v;
      }
      if (auto v = attr("_value_")) return v->as_int();
      break;
    }
    default:
      break;
  }
  throw Error("expected an int, found " + std::string(kind_name(kind)) + " " + repr(1));
}

double Value::as_float() const {
  if (kind == Kind::Float) return f;
  if (kind == Kind::Int || kind == Kind::Bool || kind == Kind::BigInt) return static_cast<double>(as_int());
  throw Error("expected a float, found " + std::string(kind_name(kind)));
}

bool Value::as_bool() const {
  if (kind == Kind::Bool) return b;
  if (kind == Kind::Int) return i != 0;
  throw Error("expected a bool, found " + std::string(kind_name(kind)));
}

const std::string& Value::as_str() const {
  if (kind != Kind::Str) throw Error("expected a str, found " + std::string(kind_name(kind)));
  return s;
}

std::vector<int64_t> Value::as_shape() const {
  if (kind == Kind::Shape) return shape;
  if (is_sequence()) {
    std::vector<int64_t> r;
    r.reserve(items.size());
    for (const auto& it : items) r.push_back(it->as_int());
    return r;
  }
  throw Error("expected a shape, found " + std::string(kind_name(kind)));
}

ucpkit::Tensor& Value::as_tensor() const {
  if (kind != Kind::Tensor) throw Error("expected a tensor, found " + std::string(kind_name(kind)));
  return *tensor;
}

std::pair<int64_t, int64_t> Value::as_fragment_address() const {
  if (kind == Kind::Object) {
    auto n = attr("numel"), st = attr("start");
    if (n && st) return {n->as_int(), st->as_int()};
    if (object->args && object->args->items.size() == 2)
      return {object->args->items[0]->as_int(), object->args->items[1]->as_int()};
  }
  if (is_sequence() && items.size() == 2) return {items[0]->as_int(), items[1]->as_int()};
  throw Error("expected a fragment_address, found " + std::string(kind_name(kind)));
}

namespace {
void render(const Value& v, int depth, std::ostringstream& o) {
  auto seq = [&](const std::vector<ValuePtr>& items, const char* open, const char* close) {
    o << open;
    if (depth <= 0 && !items.empty()) {
      o << "...";
    } else {
      for (size_t k = 0; k < items.size() && k < 8; ++k) {
        if (k) o << ", ";
        render(*items[k], depth - 1, o);
      }
      if (items.size() > 8) o << ", ... (" << items.size() << " items)";
    }
    o << close;
  };
  switch (v.kind) {
    case Kind::None: o << "None"; break;
    case Kind::Bool: o << (v.b ? "True" : "False"); break;
    case Kind::Int: o << v.i; break;
    case Kind::BigInt: o << "<int of " << v.s.size() << " bytes>"; break;
    case Kind::Float: o << v.f; break;
    case Kind::Str: o << "'" << (v.s.size() > 60 ? v.s.substr(0, 60) + "..." : v.s) << "'"; break;
    case Kind::Bytes: o << "b<" << v.s.size() << " bytes>"; break;
    case Kind::List: seq(v.items, "[", "]"); break;
    case Kind::Tuple: seq(v.items, "(", ")"); break;
    case Kind::Set: seq(v.items, "{", "}"); break;
    case Kind::FrozenSet: seq(v.items, "frozenset({", "})"); break;
    case Kind::Dict:
      o << (v.ordered ? "OrderedDict{" : "{");
      if (depth <= 0 && !v.entries.empty()) {
        o << "...";
      } else {
        for (size_t k = 0; k < v.entries.size() && k < 8; ++k) {
          if (k) o << ", ";
          render(*v.entries[k].first, 0, o);
          o << ": ";
          render(*v.entries[k].second, depth - 1, o);
        }
        if (v.entries.size() > 8) o << ", ... (" << v.entries.size() << " items)";
      }
      o << "}";
      break;
    case Kind::Shape: {
      o << "torch.Size([";
      for (size_t k = 0; k < v.shape.size(); ++k) o << (k ? ", " : "") << v.shape[k];
      o << "])";
      break;
    }
    case Kind::Dtype: o << "torch." << dtype_name(v.dtype); break;
    case Kind::Tensor: {
      o << "tensor(" << dtype_name(v.tensor->dtype()) << ", [";
      for (size_t k = 0; k < v.tensor->shape().size(); ++k) o << (k ? ", " : "") << v.tensor->shape()[k];
      o << "])";
      break;
    }
    case Kind::Global: o << "<" << v.s << "." << v.name << ">"; break;
    case Kind::Object: o << "<" << v.class_path() << " object>"; break;
  }
}
}  // namespace

std::string Value::repr(int max_depth) const {
  std::ostringstream o;
  render(*this, max_depth, o);
  return o.str();
}

ValuePtr deep_copy(const ValuePtr& root) {
  std::unordered_map<const Value*, ValuePtr> seen;
  std::function<ValuePtr(const ValuePtr&)> copy = [&](const ValuePtr& v) -> ValuePtr {
    if (!v) return nullptr;
    if (auto it = seen.find(v.get()); it != seen.end()) return it->second;
    auto c = std::make_shared<Value>(*v);
    seen[v.get()] = c;
    for (auto& it : c->items) it = copy(it);
    for (auto& [k, val] : c->entries) {
      k = copy(k);
      val = copy(val);
    }
    c->dict_state = copy(c->dict_state);
    c->tensor_type = copy(c->tensor_type);
    c->tensor_state = copy(c->tensor_state);
    if (v->tensor) c->tensor = std::make_shared<ucpkit::Tensor>(*v->tensor);
    if (v->object) {
      auto o = std::make_shared<Object>(*v->object);
      o->callable = copy(o->callable);
      o->args = copy(o->args);
      o->kwargs = copy(o->kwargs);
      o->state = copy(o->state);
      for (auto& it : o->list_items) it = copy(it);
      for (auto& [k, val] : o->dict_items) {
        k = copy(k);
        val = copy(val);
      }
      c->object = o;
    }
    return c;
  };
  return copy(root);
}

void release_tree(ValuePtr root) {
  std::vector<ValuePtr> work;
  if (root) work.push_back(std::move(root));
  auto take = [&work](ValuePtr& p) {
    if (p) work.push_back(std::move(p));
  };
  while (!work.empty()) {
    ValuePtr v = std::move(work.back());
    work.pop_back();
    for (auto& it : v->items) take(it);
    v->items.clear();
    for (auto& [k, val] : v->entries) {
      take(k);
      take(val);
    }
    v->entries.clear();
    take(v->dict_state);
    take(v->tensor_type);
    take(v->tensor_state);
    if (v->object) {
      auto o = std::move(v->object);
      take(o->callable);
      take(o->args);
      take(o->kwargs);
      take(o->state);
      for (auto& it : o->list_items) take(it);
      for (auto& [k, val] : o->dict_items) {
        take(k);
        take(val);
      }
    }
  }
}

}  // namespace ucpkit::pickle
