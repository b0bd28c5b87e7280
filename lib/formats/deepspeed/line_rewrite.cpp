// Native-MoE checkpoint folders rewritten as another DeepSpeed version line (line_rewrite.h).
#include "formats/deepspeed/line_rewrite.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/deepspeed/zero_partition.h"
#include "io/torch/torch_file.h"

namespace ucpkit::formats::deepspeed {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using NamedTensors = std::vector<std::pair<std::string, ValuePtr>>;

// What ZeRO shard 0 says of the job: its ds_config, ZeRO stage and EP size (expert param groups are
// named ep_size_<EP>, param_groups.h).
struct ShardFacts {
  ValuePtr ds_config;
  int zero_stage = 1, ep = 1;
};

ShardFacts shard_facts(const std::string& path) {
  ShardFacts f;
  ValuePtr shard = load_torch(path);
  f.ds_config = shard && shard->kind == Kind::Dict ? shard->get("ds_config") : nullptr;
  if (f.ds_config && f.ds_config->kind == Kind::Dict)
    if (auto z = f.ds_config->get("zero_optimization"); z && z->kind == Kind::Dict)
      if (auto st = z->get("stage"); st && st->kind == Kind::Int) f.zero_stage = static_cast<int>(st->i);
  if (auto osd = shard ? shard->get("optimizer_state_dict") : nullptr)
    if (auto bos = osd->get("base_optimizer_state"); bos && bos->kind == Kind::Dict)
      if (auto pg = bos->get("param_groups"); pg && pg->is_sequence())
        for (const auto& g : pg->items)
          if (auto n = g ? g->get("name") : nullptr; n && n->kind == Kind::Str)
            if (auto e = ep_size_of_group_name(n->s)) f.ep = *e;
  return f;
}

// The bit16 groups as ZeRO built them on DP rank 0: dense wd, dense no-wd (module order), then EP
// rank 0's experts (local index = global index < E/EP) wd, no-wd, in file order.
std::vector<NamedTensors> rank0_groups(const ModelStates& m, const DeepSpeedLayout& L, int ep) {
  std::vector<int> num_experts;
  if (auto ne = m.get("num_experts"); ne && ne->is_sequence())
    for (const auto& x : ne->items) num_experts.push_back(static_cast<int>(x->as_int()));
  std::vector<NamedTensors> groups(4);
  for (const auto& [name, v] : m.module) groups[megatron_group_slot(name, v->tensor->shape())].emplace_back(name, v);
  for (const auto& ef : L.expert_files) {
    if (ef.moe_layer >= static_cast<int>(num_experts.size()) || ef.expert >= num_experts[ef.moe_layer] / ep) continue;
    const ModelStates e = read_model_states(load_torch(ef.path), ef.path);
    for (const auto& [name, v] : e.module) groups[2 + megatron_group_slot(name, v->tensor->shape())].emplace_back(name, v);
  }
  return groups;
}

// A dense group's module tensors as the line saves them (bit16_group_tensors), the flat buffer
// zero-padded to 2 * DP (zero_partition.h).
void lay_out_dense_group(const NamedTensors& g, const VersionLine& line, int dp, const std::string& path,
                         std::map<std::string, ValuePtr>& fresh) {
  std::vector<GroupMember> members;
  int64_t numel = 0;
  for (const auto& [n, v] : g) {
    members.push_back({n, v->tensor->shape(), numel});
    numel += v->tensor->numel();
  }
  auto flat = [&] {
    const int64_t padded = zero12_partitioning(numel, std::max(1, dp)).padded;
    const DType dt = g.front().second->tensor->dtype();
    std::vector<uint8_t> bytes(static_cast<size_t>(padded) * dtype_size(dt), 0);
    for (size_t k = 0; k < g.size(); ++k) {
      const Tensor& t = *g[k].second->tensor;
      if (t.dtype() != dt) fail(path, "parameter " + g[k].first + " has another dtype than its group");
      t.copy_to(bytes.data() + members[k].offset * dtype_size(dt));
    }
    return Tensor::from_bytes(dt, {padded}, std::move(bytes)).storage();
  };
  const auto values = bit16_group_tensors(line.compact_copies, members,
                                          [&](size_t k) { return g[k].second->tensor->contiguous(true); }, flat);
  for (size_t k = 0; k < g.size(); ++k) fresh[g[k].first] = values[k];
}

}  // namespace

std::string rewrite_as_line(const std::string& step_dir, const VersionLine& line) {
  const DeepSpeedLayout L = discover(step_dir);
  if (L.expert_files.empty()) throw Error(step_dir + ": --ds-version applies to native DeepSpeed MoE checkpoints only");
  if (L.tp != 1 || L.pp != 1 || L.zero3) throw Error(step_dir + ": --ds-version needs TP = PP = 1 and ZeRO-1/2");
  const std::string model_path = L.model_files.at(0);
  const ValuePtr root = load_torch(model_path);
  ModelStates m = read_model_states(root, model_path);
  const std::string found = detect_moe_version_line(moe_file_facts(root, !L.expert_optim_files.empty())).name;
  if (found == line.name) return found;  // already that line: the files stay byte for byte

  const ShardFacts shard = shard_facts(L.optim_files.at(0).at(0));
  const std::vector<NamedTensors> groups = rank0_groups(m, L, shard.ep);
  m.ds_config = shard.ds_config ? shard.ds_config : minimal_moe_ds_config(shard.zero_stage, false, false, false);
  add_frozen_params(m, shard.zero_stage);
  m.param_shapes.emplace();
  for (const auto& g : groups) {
    if (g.empty()) continue;
    auto& shapes = m.param_shapes->emplace_back();
    for (const auto& [n, v] : g) shapes.emplace_back(n, v->tensor->shape());
  }
  for (size_t s = 2; s < 4; ++s)
    for (const auto& [n, v] : groups[s]) m.expert_param_names.push_back(n);
  std::map<std::string, ValuePtr> fresh;
  for (size_t s = 0; s < 2; ++s)
    if (!groups[s].empty()) lay_out_dense_group(groups[s], line, L.dp, model_path, fresh);
  for (auto& [n, v] : m.module)
    if (auto it = fresh.find(n); it != fresh.end()) v = it->second;
  save_torch_file(model_path, to_pickle(m, line), {fs::path(model_path).stem().string(), true});

  // expp_rank_R_mp_rank_00_optim_states.pt: {'optimizer': None} per EP rank, or none (0.19.5).
  for (const auto& f : L.expert_optim_files) fs::remove(f);
  for (const std::string& name : expected_expert_optim_files(shard.ep, 0, &line)) {  // mp rank 0: native MoE has TP = PP = 1
    auto d = Value::dict();
    d->set_item("optimizer", Value::none());
    save_torch_file((fs::path(L.dir) / name).string(), d, {fs::path(name).stem().string(), true});
  }
  return found;
}

}  // namespace ucpkit::formats::deepspeed
