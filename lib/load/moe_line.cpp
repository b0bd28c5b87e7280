// Native-MoE model files of one DeepSpeed version line.
#include "load/moe_line.h"

#include "layout/deepspeed/module_tree.h"

namespace ucpkit::load {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

const layout::VersionLine& resolve_moe_line(const std::string& requested, const std::string& recorded,
                                            const ValuePtr& template_root) {
  if (!requested.empty()) return layout::moe_version_line(requested);
  if (!recorded.empty()) return layout::moe_version_line(recorded);
  layout::MoeFileFacts f;
  f.expp_files = true;  // not recorded: the older universal checkpoints came from lines with expp files
  if (template_root && template_root->kind == Kind::Dict) {
    f.param_shapes = template_root->contains("param_shapes");
    f.autoep_key = template_root->contains("ds_autoep_layers");
    f.module_metadata = layout::module_has_metadata(template_root->get("module"));
    if (auto v = template_root->get("ds_version"); v && v->kind == Kind::Str) f.ds_version = v->s;
  }
  return layout::detect_moe_version_line(f);
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
  if (data_before_expert) cfg->set_item("use_data_before_expert_parallel_", Value::boolean(true));
  return cfg;
}

void apply_moe_line(const ValuePtr& root, const layout::VersionLine& line, const MoeLineInputs& in) {
  const ValuePtr module = root->get("module");
  if (line.module_metadata) {
    const std::string enc = "language_model.encoder.";
    std::vector<std::string> popped;  // Megatron pops the expert keys after encoder.state_dict() ran
    for (const auto& n : in.expert_local_names)
      if (n.rfind(enc, 0) == 0) popped.push_back(n.substr(enc.size()));
    layout::add_module_metadata(module, {{"language_model.encoder", popped}});
  } else {
    layout::drop_module_metadata(module);
  }

  // Values of DeepSpeed's keys for this line: the template's where it has them, else what the
  // line's save code puts there.
  auto value_of = [&](const std::string& key) -> ValuePtr {
    if (key == "param_shapes") return in.param_shapes;
    if (key == "ds_config") return in.ds_config;
    if (key == "ds_version") {
      auto v = root->get("ds_version");
      if (v && v->kind == Kind::Str && layout::moe_line_of_release(v->s) == line.name) return v;
      return Value::str(line.ds_version);
    }
    if (auto v = root->get(key)) return v;
    if (key == "buffer_names") return Value::list();
    if (key == "shared_params") return Value::dict();
    if (key == "frozen_param_shapes" || key == "frozen_param_fragments")  // save_frozen_param: ZeRO >= 2
      return in.zero_stage >= 2 ? Value::dict(true) : Value::none();
    return Value::none();  // optimizer, ds_autoep_layers, data_sampler, random_ltd
  };
  static const char* const kDeepSpeedKeys[] = {
      "module",        "buffer_names",  "optimizer",     "param_shapes",   "frozen_param_shapes",
      "shared_params", "frozen_param_fragments",         "lr_scheduler",   "data_sampler", "random_ltd",
      "sparse_tensor_module_names",     "skipped_steps", "global_steps",   "global_samples",
      "dp_world_size", "mp_world_size", "ds_config",     "ds_version",     "num_experts", "ds_autoep_layers"};
  auto out = Value::dict(root->ordered);
  for (const auto& k : line.mp_rank_keys) out->set_item(k, value_of(k));
  for (const auto& [k, v] : root->entries) {
    if (!k || k->kind != Kind::Str) continue;
    bool deepspeed_key = false;
    for (const char* d : kDeepSpeedKeys) deepspeed_key |= k->s == d;
    if (!deepspeed_key) out->entries.emplace_back(k, v);  // Megatron's client state, in template order
  }
  root->entries = std::move(out->entries);
}

}  // namespace ucpkit::load
