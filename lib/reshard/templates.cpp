// Template model-states files parsed once per ucp-load run, and the native-MoE line written.
#include "reshard/templates.h"

#include "core/error.h"
#include "io/torch/torch_file.h"

namespace ucpkit::reshard {

Templates::Templates(std::vector<std::string> paths, const TorchLoadOptions& open)
    : paths_(std::move(paths)), open_(open), roots_(paths_.size()) {}

const pickle::ValuePtr& Templates::model_states(int file) const {
  std::lock_guard lock(mu_);
  pickle::ValuePtr& t = roots_.at(static_cast<size_t>(file));
  if (!t) {  // kept only once it is known good: asked again, a bad file is refused again
    const std::string& path = paths_[static_cast<size_t>(file)];
    auto root = load_torch(path, open_);
    if (!root || root->kind != pickle::Kind::Dict) fail(path, "not a model-states dict");
    t = std::move(root);
  }
  return t;
}

size_t Templates::parsed() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& r : roots_) n += r != nullptr;
  return n;
}

const formats::deepspeed::VersionLine* target_moe_line(const ModelInfo& model, const TargetLayout& target,
                                                       const Templates& templates) {
  if (!model.native_moe || templates.paths().empty()) return nullptr;
  // The template is read only when neither the request nor the manifest names the line.
  const bool named = !target.ds_line.empty() || !model.ds_line.empty();
  return &formats::deepspeed::resolve_moe_line(target.ds_line, model.ds_line, named ? nullptr : templates.model_states(0));
}

}  // namespace ucpkit::reshard
