// Re-tagging tensor storages as "cpu" (see storage_tags.h).
#include "formats/deepspeed/storage_tags.h"

#include <set>

#include "io/tensor.h"

namespace ucpkit::formats::deepspeed {

namespace {

void walk(const pickle::ValuePtr& v, std::set<const void*>& seen, size_t& n) {
  if (!v || !seen.insert(v.get()).second) return;
  using pickle::Kind;
  switch (v->kind) {
    case Kind::Tensor:
      if (v->tensor && v->tensor->storage() && v->tensor->storage()->location != "cpu") {
        v->tensor->storage()->location = "cpu";
        ++n;
      }
      break;
    case Kind::Dict:
      for (const auto& [k, x] : v->entries) walk(x, seen, n);
      walk(v->dict_state, seen, n);
      break;
    case Kind::List:
    case Kind::Tuple:
    case Kind::Set:
    case Kind::FrozenSet:
      for (const auto& x : v->items) walk(x, seen, n);
      break;
    case Kind::Object:
      if (v->object) {
        walk(v->object->args, seen, n);
        walk(v->object->state, seen, n);
        for (const auto& x : v->object->list_items) walk(x, seen, n);
        for (const auto& [k, x] : v->object->dict_items) walk(x, seen, n);
      }
      break;
    default: break;
  }
}

}  // namespace

size_t tag_storages_cpu(const pickle::ValuePtr& v) {
  std::set<const void*> seen;
  size_t n = 0;
  walk(v, seen, n);
  return n;
}

}  // namespace ucpkit::formats::deepspeed
