// Native-MoE model files of one DeepSpeed version line.
#include "reshard/moe_line.h"

#include <filesystem>
#include <map>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/zero_partition.h"
#include "formats/deepspeed/module_tree.h"
#include "formats/deepspeed/moe.h"
#include "formats/deepspeed/param_groups.h"

namespace ucpkit::reshard {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

const formats::deepspeed::VersionLine& resolve_moe_line(const std::string& requested, const std::string& recorded,
                                            const ValuePtr& template_root) {
  if (!requested.empty()) return formats::deepspeed::moe_version_line(requested);
  if (!recorded.empty()) return formats::deepspeed::moe_version_line(recorded);
  // expp files not recorded: the older universal checkpoints came from lines with expp files
  return formats::deepspeed::detect_moe_version_line(formats::deepspeed::moe_file_facts(template_root, true));
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
  if (data_before_expert) cfg->set_item(formats::deepspeed::kUseDataBeforeExpertParallelism, Value::boolean(true));
  return cfg;
}

void apply_moe_line(const ValuePtr& root, const formats::deepspeed::VersionLine& line, const MoeLineInputs& in) {
  const ValuePtr module = root->get("module");
  if (line.module_metadata) {
    const std::string enc = "language_model.encoder.";
    std::vector<std::string> popped;  // Megatron pops the expert keys after encoder.state_dict() ran
    for (const auto& n : in.expert_local_names)
      if (n.rfind(enc, 0) == 0) popped.push_back(n.substr(enc.size()));
    formats::deepspeed::add_module_metadata(module, {{"language_model.encoder", popped}});
  } else {
    formats::deepspeed::drop_module_metadata(module);
  }

  // Values of DeepSpeed's keys for this line: the template's where it has them, else what the
  // line's save code puts there.
  auto value_of = [&](const std::string& key) -> ValuePtr {
    if (key == "param_shapes") return in.param_shapes;
    if (key == "ds_config") return in.ds_config;
    if (key == "ds_version") {
      if (!in.ds_release.empty()) return Value::str(in.ds_release);
      auto v = root->get("ds_version");
      if (v && v->kind == Kind::Str && formats::deepspeed::moe_line_of_release(v->s) == line.name) return v;
      return Value::str(line.ds_version);
    }
    if (auto v = root->get(key)) return v;
    if (key == formats::deepspeed::kCheckpointParallelDims) {  // native MoE targets are TP = PP = 1 (engine.py:238-246)
      auto d = Value::dict();
      d->set_item("pp_degree", Value::integer(1));
      d->set_item("tp_degree", Value::integer(1));
      return d;
    }
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
      "dp_world_size", "mp_world_size", "ds_config",     "ds_version",     "num_experts", "ds_autoep_layers",
      formats::deepspeed::kCheckpointParallelDims};
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

}  // namespace ucpkit::reshard

namespace ucpkit::reshard {
namespace {

namespace fs = std::filesystem;

}  // namespace

std::string relayout_moe_folder(const std::string& step_dir, const formats::deepspeed::VersionLine& line) {
  const formats::deepspeed::DeepSpeedLayout L = formats::deepspeed::discover(step_dir);
  if (L.expert_files.empty()) throw Error(step_dir + ": --ds-version applies to native DeepSpeed MoE checkpoints only");
  if (L.tp != 1 || L.pp != 1 || L.zero3) throw Error(step_dir + ": --ds-version needs TP = PP = 1 and ZeRO-1/2");
  const std::string model_path = L.model_files.at(0);
  ValuePtr root = load_torch(model_path);
  if (!root || root->kind != Kind::Dict) fail(model_path, "not a model-states dict");
  const formats::deepspeed::MoeFileFacts facts = formats::deepspeed::moe_file_facts(root, !L.expert_optim_files.empty());
  const std::string found = formats::deepspeed::detect_moe_version_line(facts).name;
  if (found == line.name) return found;  // already that line: the files stay byte for byte

  // ZeRO shard 0: ds_config, stage, EP size (expert groups are named ep_size_<EP>).
  ValuePtr shard = load_torch(L.optim_files.at(0).at(0));
  ValuePtr cfg = shard && shard->kind == Kind::Dict ? shard->get("ds_config") : nullptr;
  int zero_stage = 1, ep = 1;
  if (cfg && cfg->kind == Kind::Dict)
    if (auto z = cfg->get("zero_optimization"); z && z->kind == Kind::Dict)
      if (auto st = z->get("stage"); st && st->kind == Kind::Int) zero_stage = static_cast<int>(st->i);
  if (auto osd = shard ? shard->get("optimizer_state_dict") : nullptr)
    if (auto bos = osd->get("base_optimizer_state"); bos && bos->kind == Kind::Dict)
      if (auto pg = bos->get("param_groups"); pg && pg->is_sequence())
        for (const auto& g : pg->items)
          if (auto n = g ? g->get("name") : nullptr; n && n->kind == Kind::Str)
            if (auto e = formats::deepspeed::ep_size_from_group_name(n->s)) ep = *e;
  std::vector<int> num_experts;
  if (auto ne = root->get("num_experts"); ne && ne->is_sequence())
    for (const auto& x : ne->items) num_experts.push_back(static_cast<int>(x->as_int()));

  // Groups as ZeRO built them on DP rank 0: dense wd, dense no-wd (module order), then EP rank 0's
  // experts (local index = global index < E/EP) wd, no-wd, in file order.
  const ValuePtr module = root->get("module");
  std::vector<std::vector<std::pair<std::string, ValuePtr>>> groups(4);
  for (auto& [name, v] : formats::deepspeed::module_tensors(module)) groups[formats::deepspeed::megatron_group_slot(name, v->tensor->shape())].emplace_back(name, v);
  for (const auto& ef : L.expert_files) {
    if (ef.moe_layer >= static_cast<int>(num_experts.size()) || ef.expert >= num_experts[ef.moe_layer] / ep) continue;
    ValuePtr e = load_torch(ef.path);
    if (!e || e->kind != Kind::Dict) fail(ef.path, "not an expert state dict");
    for (const auto& [k, v] : e->entries)
      if (v && v->kind == Kind::Tensor) groups[2 + formats::deepspeed::megatron_group_slot(k->as_str(), v->tensor->shape())].emplace_back(k->as_str(), v);
  }
  MoeLineInputs in;
  in.zero_stage = zero_stage;
  in.ds_config = cfg ? cfg : minimal_moe_ds_config(zero_stage, false, false, false);
  in.param_shapes = Value::list();
  for (const auto& g : groups) {
    if (g.empty()) continue;
    auto d = Value::dict(true);
    for (const auto& [n, v] : g) d->set_item(n, Value::torch_size(v->tensor->shape()));
    in.param_shapes->items.push_back(d);
  }
  for (int s = 2; s < 4; ++s)
    for (const auto& [n, v] : groups[static_cast<size_t>(s)]) in.expert_local_names.push_back(n);

  // Module tensors: views into one zero-padded flat buffer per dense group (0.14; aligned to
  // 2 * DP, stage_1_and_2.py:354-357), or each its own compact copy (later lines).
  std::map<std::string, ValuePtr> fresh;
  for (int s = 0; s < 2; ++s) {
    const auto& g = groups[static_cast<size_t>(s)];
    if (g.empty()) continue;
    if (line.compact_copies) {
      for (const auto& [n, v] : g) fresh[n] = Value::of_tensor(v->tensor->contiguous(true));
      continue;
    }
    int64_t numel = 0;
    for (const auto& [n, v] : g) numel += v->tensor->numel();
    const int64_t padded = formats::deepspeed::zero12_partitioning(numel, std::max(1, L.dp)).padded;
    const DType dt = g.front().second->tensor->dtype();
    std::vector<uint8_t> bytes(static_cast<size_t>(padded) * dtype_size(dt), 0);
    int64_t off = 0;
    for (const auto& [n, v] : g) {
      if (v->tensor->dtype() != dt) fail(model_path, "parameter " + n + " has another dtype than its group");
      v->tensor->copy_to(bytes.data() + off * dtype_size(dt));
      off += v->tensor->numel();
    }
    const Tensor flat = Tensor::from_bytes(dt, {padded}, std::move(bytes));
    off = 0;
    for (const auto& [n, v] : g) {
      const auto& shape = v->tensor->shape();
      fresh[n] = Value::of_tensor(Tensor(flat.storage(), off, shape, Tensor::contiguous_strides(shape)));
      off += v->tensor->numel();
    }
  }
  formats::deepspeed::replace_module_tensors(module, [&](const std::string& n, const ValuePtr&) -> ValuePtr {
    auto it = fresh.find(n);
    return it == fresh.end() ? nullptr : it->second;
  });
  apply_moe_line(root, line, in);
  save_torch_file(model_path, root, {fs::path(model_path).stem().string(), true});

  // expp_rank_R_mp_rank_00_optim_states.pt: {'optimizer': None} per EP rank, or none (0.19.5).
  for (const auto& f : L.expert_optim_files) fs::remove(f);
  if (line.expp_files)
    for (int r = 0; r < ep; ++r) {
      auto d = Value::dict();
      d->set_item("optimizer", Value::none());
      const std::string name = formats::deepspeed::expert_optim_name(r, 0);
      save_torch_file((fs::path(L.dir) / name).string(), d, {fs::path(name).stem().string(), true});
    }
  return found;
}

}  // namespace ucpkit::reshard
