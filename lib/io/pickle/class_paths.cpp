// Default class-path allow-list of checkpoint pickles (see class_paths.h).
#include "io/pickle/class_paths.h"

#include <cstddef>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"

namespace ucpkit::pickle {
namespace {

#include "io/pickle/class_paths_table.inc"

// Packages whose objects DeepSpeed / Megatron / HF training checkpoints pickle (args, client state,
// loss scalers, enums, numpy RNG states, TE extra state, configs; Lightning's DeepSpeed strategy puts
// hyper_parameters, an AttributeDict of lightning_fabric.utilities.data, into the client state).
const char* const kFrameworkRoots[] = {"torch",  "numpy",        "deepspeed", "megatron",   "apex",
                                       "transformer_engine", "transformers", "accelerate", "omegaconf",
                                       "nemo",   "lightning",    "lightning_fabric", "pytorch_lightning", "fairscale", "peft"};

struct Tables {
  std::unordered_set<std::string_view> roots;
  std::unordered_map<std::string_view, std::unordered_set<std::string_view>> exact;
  Tables() {
    for (const char* r : kStandardRoots) roots.insert(r);
    for (const char* r : kFrameworkRoots) roots.insert(r);
    for (const auto& m : kExactModules) exact[m.module].insert(m.names, m.names + m.count);
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

std::vector<std::string>& trusted() {
  static std::vector<std::string> t;
  return t;
}

bool is_trusted(std::string_view module) {
  for (const auto& t : trusted()) {
    if (t == "*" || module == t) return true;
    if (module.size() > t.size() && module.substr(0, t.size()) == t && module[t.size()] == '.') return true;
  }
  return false;
}

}  // namespace

void trust_modules(const std::vector<std::string>& modules) {
  for (const auto& m : modules)
    if (!m.empty()) trusted().push_back(m);
}

void reset_trusted_modules() { trusted().clear(); }

std::string class_path_problem(std::string_view module, std::string_view name) {
  if (is_trusted(module)) return {};
  const Tables& t = tables();
  const std::string_view root = module.substr(0, module.find('.'));
  if (!t.roots.count(root))
    return "module '" + escaped_brief(module) +
           "' is not under Python's standard library or a training framework (damaged? if the checkpoint "
           "really pickles it, pass --trust-module " + escaped_brief(root) + ")";
  auto it = t.exact.find(module);
  if (it != t.exact.end() && !it->second.count(name.substr(0, name.find('.'))))
    return "module '" + escaped_brief(module) + "' has no '" + escaped_brief(name) +
           "' (damaged? --trust-module " + escaped_brief(module) + " accepts it)";
  return {};
}

}  // namespace ucpkit::pickle
