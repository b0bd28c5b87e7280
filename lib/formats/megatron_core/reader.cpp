#include "formats/megatron_core/reader.h"

#include <filesystem>

#include "core/error.h"
#include "formats/megatron_core/leading_slice.h"
#include "io/torch/torch_file.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::megatron_core {

std::string_view optimizer_format_name(OptimizerFormat f) {
  switch (f) {
    case OptimizerFormat::None: return "none";
    case OptimizerFormat::DpReshardable: return "dp_reshardable";
    case OptimizerFormat::FullyReshardable: return "fully_reshardable";
  }
  return "?";
}

Checkpoint::Checkpoint(const std::string& path) : dir_(iteration_dir(path)) {
  config_ = read_config(dir_);
  const std::string md = (fs::path(dir_) / ".metadata").string();
  if (!fs::exists(md)) fail(dir_, "Megatron-Core torch_dist: no .metadata (not a reshardable DCP save)");
  dcp_ = std::make_unique<dcp::Reader>(dir_);
  common_ = read_common_state(dir_, *dcp_);
  classify();
  check_optimizer_format();
  check_norm_repeats();
}

void Checkpoint::classify() {
  const auto& md = dcp_->metadata();
  keys_.reserve(md.entries.size());
  for (const auto& e : md.entries) keys_.push_back(classify_key(e.fqn, e.is_bytes, md.path));
  for (size_t i = 0; i < keys_.size(); ++i) {
    const Key& k = keys_[i];
    if (k.kind != KeyKind::Model) continue;
    for (auto& s : param_slices(k.model, md.entries[i].size, md.path)) {
      if (!param_index_.emplace(s.name, params_.size()).second)
        fail(md.path, "Megatron-Core torch_dist: parameter " + escaped_brief(s.name) + " stored twice");
      params_.push_back({std::move(s), k.fqn, &k});
    }
  }
  set_aside_norm_repeats();
}

// decoder.layers.{L}.pre_mlp_layernorm.<w> beside decoder.layers.{L}.mlp.linear_fc1.layer_norm_<w>: no layer spec of
// Megatron's has both (gpt_layer_specs.py: the local spec maps the first to the second, the Transformer Engine spec
// has only the first), so the first repeats the second.
void Checkpoint::set_aside_norm_repeats() {
  std::vector<ModelParam> kept;
  std::vector<std::pair<ModelParam, std::string>> repeats;  // the repeat and the name it repeats
  for (auto& p : params_) {
    if (is_te_spec_norm_name(p.slice.name)) {
      std::string of = other_spec_norm_name(p.slice.name);
      if (param_index_.count(of)) {
        repeats.emplace_back(std::move(p), std::move(of));
        continue;
      }
    }
    kept.push_back(std::move(p));
  }
  params_ = std::move(kept);
  if (repeats.empty()) return;  // the same order: the index holds
  param_index_.clear();
  for (size_t i = 0; i < params_.size(); ++i) param_index_.emplace(params_[i].slice.name, i);
  for (auto& [p, of] : repeats) norm_repeats_.emplace_back(std::move(p), param_index_.at(of));
}

void Checkpoint::check_norm_repeats() const {
  for (const auto& [p, of] : norm_repeats_) {
    std::vector<std::string> states = {""};
    if (optimizer_format_ == OptimizerFormat::FullyReshardable) states.insert(states.end(), {"param", "exp_avg", "exp_avg_sq"});
    for (const auto& s : states)
      if (!read_param(p, s).equal(read_param(params_[of], s)))
        fail(dcp_->metadata().path, "Megatron-Core torch_dist: " + escaped_brief(p.slice.name) + (s.empty() ? "" : " " + s) +
                                        " differs from " + escaped_brief(params_[of].slice.name) +
                                        " (one norm under the two layer specs' keys)");
  }
}

// The format the common state names (content_metadata.distrib_optim_sharding_type) must be the one
// the tensors have; without content_metadata (older saves) the tensors decide.
void Checkpoint::check_optimizer_format() {
  bool state = false, bucket = false;
  for (const auto& k : keys_) {
    state = state || k.kind == KeyKind::OptimizerState;
    bucket = bucket || k.kind == KeyKind::DpBucket;
  }
  const std::string& file = dcp_->metadata().path;
  if (state && bucket) fail(file, "Megatron-Core torch_dist: both fully_reshardable and dp_reshardable optimizer tensors");
  optimizer_format_ = state ? OptimizerFormat::FullyReshardable
                            : bucket ? OptimizerFormat::DpReshardable : OptimizerFormat::None;
  const auto named = common_.content_string("distrib_optim_sharding_type");
  if (!named || optimizer_format_ == OptimizerFormat::None) return;
  if (*named != optimizer_format_name(optimizer_format_))
    fail(common_.source, "Megatron-Core torch_dist: content_metadata names distrib_optim_sharding_type " +
                             escaped_brief(*named) + " but the tensors are " +
                             std::string(optimizer_format_name(optimizer_format_)));
}

const ModelParam& Checkpoint::param(const std::string& name) const {
  const auto it = param_index_.find(name);
  if (it == param_index_.end())
    fail(dcp_->metadata().path, "Megatron-Core torch_dist: no parameter " + escaped_brief(name));
  return params_[it->second];
}

std::string Checkpoint::state_fqn(const ModelParam& p, const std::string& state) const {
  std::string fqn = p.fqn;
  if (!state.empty()) {
    fqn = "optimizer.state." + state + "." + p.key->model.key;
    const auto* e = dcp_->metadata().find(fqn);
    if (!e || e->is_bytes)
      fail(dcp_->metadata().path, "Megatron-Core torch_dist: no optimizer state " + escaped_brief(state) + " of " +
                                      escaped_brief(p.slice.name) + " (optimizer format " +
                                      std::string(optimizer_format_name(optimizer_format_)) + ")");
    const auto* m = dcp_->metadata().find(p.fqn);
    if (m && m->size != e->size)
      fail(dcp_->metadata().path, "Megatron-Core torch_dist: " + escaped_brief(fqn) + " has another shape than its parameter");
  }
  return fqn;
}

Tensor Checkpoint::read_param(const ModelParam& p, const std::string& state) const {
  return read_leading_slice(*dcp_, state_fqn(p, state), p.slice.index);
}

std::unique_ptr<dcp::RangeReader> Checkpoint::range_param(const ModelParam& p, const std::string& state) const {
  return dcp::RangeReader::open(*dcp_, state_fqn(p, state), p.slice.index);
}

std::vector<const Key*> Checkpoint::buckets() const {
  std::vector<const Key*> out;
  for (const auto& k : keys_)
    if (k.kind == KeyKind::DpBucket) out.push_back(&k);
  return out;
}

Tensor Checkpoint::read_bucket(const Key& key) const {
  if (key.kind != KeyKind::DpBucket || !dcp_->metadata().find(key.fqn))
    fail(dcp_->metadata().path, "Megatron-Core torch_dist: no dp_reshardable bucket " + escaped_brief(key.fqn));
  return dcp_->read_tensor(key.fqn);
}

pickle::ValuePtr Checkpoint::read_object(const std::string& fqn) const {
  const auto* e = dcp_->metadata().find(fqn);
  if (!e || !e->is_bytes) fail(dcp_->metadata().path, "Megatron-Core torch_dist: no ShardedObject " + escaped_brief(fqn));
  const auto& item = dcp_->metadata().item_of(fqn, nullptr);
  const std::string file = (fs::path(dir_) / item.storage.relative_path).string();
  const auto list = load_torch_bytes(dcp_->read_bytes(fqn), file + " (" + fqn + ")").root;
  if (!list || !list->is(pickle::Kind::List) || list->items.size() != 1)
    fail(file, escaped_brief(fqn) + ": expected a list of one object (ShardedObject item)");
  return list->items[0];
}

}  // namespace ucpkit::formats::megatron_core
