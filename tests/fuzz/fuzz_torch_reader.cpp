// libFuzzer target for the torch-file readers: container detection, zip directory, legacy layout and
// the unpickler. Any input must load or end in ucpkit::Error; everything else (another exception, a
// sanitizer report, a leak, a timeout) is a finding.
#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "io/pickle/unpickler.h"
#include "io/torch/torch_file.h"

namespace {

using ucpkit::pickle::Value;
using ucpkit::pickle::ValuePtr;

// Visits every value once and reads every tensor's elements (lazy views must stay inside the file).
void touch(const ValuePtr& root) {
  std::vector<const Value*> work{root.get()};
  std::unordered_set<const Value*> seen;
  std::vector<uint8_t> buf;
  while (!work.empty()) {
    const Value* v = work.back();
    work.pop_back();
    if (!v || !seen.insert(v).second) continue;
    for (const auto& it : v->items) work.push_back(it.get());
    for (const auto& [k, val] : v->entries) {
      work.push_back(k.get());
      work.push_back(val.get());
    }
    if (v->object) {
      work.push_back(v->object->callable.get());
      work.push_back(v->object->args.get());
      work.push_back(v->object->kwargs.get());
      work.push_back(v->object->state.get());
      for (const auto& it : v->object->list_items) work.push_back(it.get());
      for (const auto& [k, val] : v->object->dict_items) {
        work.push_back(k.get());
        work.push_back(val.get());
      }
    }
    if (v->tensor && v->tensor->storage() && v->tensor->nbytes() <= (64u << 20)) {
      buf.resize(v->tensor->nbytes());
      v->tensor->copy_to(buf.data());
    }
    (void)v->repr(2);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  try {
    auto tf = ucpkit::load_torch_bytes(bytes, "fuzz.pt");
    touch(tf.root);
    ucpkit::pickle::release_tree(tf.root);
  } catch (const ucpkit::Error&) {
  }
  // The unpickler on its own, with persistent ids resolved to None.
  try {
    ucpkit::pickle::UnpickleOptions opt;
    opt.persistent_load = [](const ValuePtr&) { return Value::none(); };
    size_t consumed = 0;
    auto v = ucpkit::pickle::unpickle(bytes, "fuzz.pkl", opt, &consumed);
    touch(v);
    ucpkit::pickle::release_tree(v);
  } catch (const ucpkit::Error&) {
  }
  return 0;
}
