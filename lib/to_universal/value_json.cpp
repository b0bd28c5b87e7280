// Pickle values as JSON.
#include "to_universal/value_json.h"

namespace ucpkit::to_universal {

using pickle::Kind;

nlohmann::json value_to_json(const pickle::ValuePtr& v) {
  if (!v) return nullptr;
  switch (v->kind) {
    case Kind::None: return nullptr;
    case Kind::Bool: return v->b;
    case Kind::Int: return v->i;
    case Kind::BigInt:
      try {
        return v->as_int();
      } catch (...) {
        return "<bigint>";
      }
    case Kind::Float: return v->f;
    case Kind::Str: return v->s;
    case Kind::List:
    case Kind::Tuple:
    case Kind::Set:
    case Kind::FrozenSet: {
      auto a = nlohmann::json::array();
      for (const auto& x : v->items) a.push_back(value_to_json(x));
      return a;
    }
    case Kind::Dict: {
      auto o = nlohmann::json::object();
      for (const auto& [k, x] : v->entries) {
        std::string key = k && k->kind == Kind::Str ? k->s : (k && k->kind == Kind::Int ? std::to_string(k->i) : "?");
        o[key] = value_to_json(x);
      }
      return o;
    }
    case Kind::Shape: return v->shape;
    case Kind::Dtype: return "torch." + std::string(dtype_name(v->dtype));
    case Kind::Object: {
      // Dataclass-like objects (SubparamShape in universal_checkpoint_info) keep their fields.
      if (v->object && v->object->state && v->object->state->kind == Kind::Dict) return value_to_json(v->object->state);
      return "<" + v->class_path() + ">";
    }
    default: return "<" + std::string(pickle::kind_name(v->kind)) + ">";
  }
}

pickle::ValuePtr get_int_key(const pickle::ValuePtr& dict, int64_t key) {
  if (!dict || dict->kind != Kind::Dict) return nullptr;
  for (const auto& [k, x] : dict->entries)
    if (k && k->kind == Kind::Int && k->i == key) return x;
  return nullptr;
}

}  // namespace ucpkit::to_universal
