// DeepSpeed / Megatron-DeepSpeed target files: model states, pipeline layer files, ZeRO shards.
#include "reshard/deepspeed_writer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/module_tree.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/deepspeed/pickled_classes.h"
#include "formats/deepspeed/pipeline.h"
#include "formats/deepspeed/storage_tags.h"
#include "formats/deepspeed/file_names.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

using pickle::Kind;
using pickle::Object;
using pickle::Value;
using pickle::ValuePtr;

// What the written model states, ds_config and Megatron args say of the target layout.
formats::deepspeed::LayoutFacts DeepSpeedWriter::layout_facts() const {
  const auto& t = plan_.target;
  return {.tp = t.tp, .pp = t.pp, .dp = t.dp, .ep = t.ep, .zero_stage = t.zero_stage,
          .sub_group_size = t.sub_group_size, .dtype = t.dtype, .padded_vocab = plan_.padded_vocab,
          .source_dp = model_.source_dp, .autoep = model_.autoep};
}

DeepSpeedWriter::DeepSpeedWriter(const ModelInfo& model, const UcpInfo& plan, UniversalReader& reader,
                                 ValuePtr common_optimizer_state, std::shared_ptr<const Templates> templates,
                                 const formats::deepspeed::VersionLine* moe_line)
    : model_(model), plan_(plan), reader_(reader), common_(std::move(common_optimizer_state)),
      templates_(std::move(templates)), moe_line_(moe_line) {
  if (!common_ || common_->kind != Kind::Dict) throw Error("zero/optimizer_state.pt: not a dict");
  if (!templates_) throw Error("DeepSpeedWriter: no templates (internal error)");
  if (moe_line_) {
    const std::string& req = plan_.target.ds_line;
    if (!req.empty() && req != moe_line_->name) ds_release_ = req[0] == 'v' ? req.substr(1) : req;
  }
}

namespace {
std::shared_ptr<const Templates> own_templates(const ModelInfo& model) {
  return std::make_shared<const Templates>(model.model_files);
}
}  // namespace

DeepSpeedWriter::DeepSpeedWriter(const ModelInfo& model, const UcpInfo& plan, UniversalReader& reader,
                                 ValuePtr common_optimizer_state)
    : DeepSpeedWriter(model, plan, reader, std::move(common_optimizer_state), own_templates(model), nullptr) {
  moe_line_ = target_moe_line(model_, plan_.target, *templates_);
  const std::string& req = plan_.target.ds_line;
  if (moe_line_ && !req.empty() && req != moe_line_->name) ds_release_ = req[0] == 'v' ? req.substr(1) : req;
}

void DeepSpeedWriter::fill_runs(const std::vector<Run>& runs, const std::string& state, int64_t e0, int64_t n,
                                float* dst) const {
  const int64_t end = e0 + n;
  int64_t at = e0;
  for (const Run& r : runs) {
    if (r.start + r.numel <= at) continue;
    if (r.start >= end) break;
    if (r.start > at) {
      std::memset(dst + (at - e0), 0, static_cast<size_t>(r.start - at) * sizeof(float));
      at = r.start;
    }
    const int64_t b = std::min(end, r.start + r.numel);
    reader_.read_range(r.slot->param, state, r.slot->slice, r.param_offset + (at - r.start),
                       r.param_offset + (b - r.start), dst + (at - e0));
    at = b;
  }
  if (at < end) std::memset(dst + (at - e0), 0, static_cast<size_t>(end - at) * sizeof(float));
}

std::shared_ptr<Storage> DeepSpeedWriter::streamed(DType dtype, int64_t numel, std::vector<Run> runs,
                                                   const std::string& state, StorageSources* sources) const {
  for (size_t k = 1; k < runs.size(); ++k)
    if (runs[k].start < runs[k - 1].start + runs[k - 1].numel) throw Error("flat buffer runs overlap or are unsorted");
  std::vector<Source> recorded;
  if (sources) {
    const uint64_t es = dtype_size(dtype);
    const int si = reader_.state_index(state);
    for (const Run& r : runs)
      recorded.push_back({static_cast<uint64_t>(r.start) * es, static_cast<uint64_t>(r.start + r.numel) * es, r.slot,
                          r.param_offset, si});
  }
  auto storage = Storage::generated(dtype, numel, [this, dtype, runs = std::move(runs), state](uint64_t off, std::span<uint8_t> out) {
    const size_t es = dtype_size(dtype);
    const int64_t e0 = static_cast<int64_t>(off / es), n = static_cast<int64_t>(out.size() / es);
    if (dtype == DType::Float32) {
      fill_runs(runs, state, e0, n, reinterpret_cast<float*>(out.data()));
      return;
    }
    thread_local std::vector<float> tmp;  // reused window: stays in cache
    if (tmp.size() < static_cast<size_t>(n)) tmp.resize(static_cast<size_t>(n));
    fill_runs(runs, state, e0, n, tmp.data());
    convert_from_fp32(tmp.data(), static_cast<size_t>(n), dtype, out.data());
  });
  if (sources) (*sources)[storage.get()] = std::move(recorded);
  return storage;
}

Tensor DeepSpeedWriter::partition_tensor(const GroupPlan& g, int part, const std::string& state, int64_t length,
                                         bool stream, StorageSources* sources) const {
  const int64_t n = length < 0 ? g.partition : length;
  std::vector<Run> runs;
  for (const auto& f : partition_of(g, part).fragments)
    if (f.start < n) runs.push_back({&g.slots[f.slot], f.start, std::min(f.numel, n - f.start), f.param_offset});
  auto storage = streamed(DType::Float32, n, std::move(runs), state, stream ? sources : nullptr);
  if (!stream) {
    std::vector<uint8_t> bytes(static_cast<size_t>(storage->nbytes()));
    storage->generate(0, bytes);
    storage = Storage::owned(DType::Float32, std::move(bytes));
  }
  return Tensor(storage, 0, {n}, {1});
}

Tensor DeepSpeedWriter::low_precision_slice(const Slot& s, StorageSources* sources) const {
  auto storage = streamed(plan_.target.dtype, s.numel(), {{&s, 0, s.numel(), 0}}, "fp32", sources);
  return Tensor(storage, 0, s.slice.shape, Tensor::contiguous_strides(s.slice.shape));
}

// ds_version of the ZeRO shards: the source's, or the release of the native-MoE line written when
// the source's release belongs to another line.
ValuePtr DeepSpeedWriter::target_ds_version() const {
  if (!ds_release_.empty()) return Value::str(ds_release_);
  auto ver = formats::deepspeed::raw_ds_version(common_);
  if (moe_line_ && (!ver || ver->kind != Kind::Str || formats::deepspeed::moe_line_of_release(ver->s) != moe_line_->name))
    return Value::str(moe_line_->ds_version);
  if (ver) return ver;
  // ZeRO-3 sources: the universal optimizer_state.pt is the inner optimizer dict, without
  // ds_version (ds_to_universal.py:761-767); the model file has it.
  if (auto m = template_root(0); m && m->kind == Kind::Dict)
    if (auto v = formats::deepspeed::raw_ds_version(m); v && v->kind == Kind::Str) return v;
  return Value::str("0.16.4");
}

// The template's module with the target's weights of `mr`: views into one low-precision flat buffer
// per group, as ZeRO saves them; compact copies from DeepSpeed 0.17.1 on (clone_tensors_for_torch_save);
// ZeRO-3 keeps the weights only in the optimizer shards, the module holds 0-element placeholders.
ValuePtr DeepSpeedWriter::target_module(const MpRankPlan& mr, const ValuePtr& module, StorageSources& sources,
                                        const std::vector<std::pair<std::string, std::string>>& tied) const {
  const auto& t = plan_.target;
  std::map<std::string, ValuePtr> fresh;
  const bool compact = moe_line_ && moe_line_->compact_copies;
  for (const GroupPlan& g : mr.groups) {
    if (t.zero_stage == 3) {
      for (const Slot& s : g.slots)
        fresh[model_.params[s.param].name] = Value::of_tensor(Tensor(Storage::zeros(t.dtype, 0), 0, {0}, {1}));
      continue;
    }
    std::vector<formats::deepspeed::GroupMember> members;
    for (const Slot& s : g.slots) members.push_back({model_.params[s.param].name, s.slice.shape, s.offset});
    auto flat = [&] {
      std::vector<Run> runs;
      for (const Slot& s : g.slots) runs.push_back({&s, s.offset, s.numel(), 0});
      return streamed(t.dtype, g.padded, std::move(runs), "fp32", &sources);
    };
    const auto values = formats::deepspeed::bit16_group_tensors(
        compact, members, [&](size_t k) { return low_precision_slice(g.slots[k], &sources); }, flat);
    for (size_t k = 0; k < members.size(); ++k) fresh[members[k].name] = values[k];
  }
  // A tied entry (shared_params) is its parameter's tensor, one storage, as the engine's state_dict holds it;
  // otherwise it would keep the template's value.
  std::map<std::string, ValuePtr> aliases;
  for (const auto& [alias, param] : tied)
    if (auto it = fresh.find(param); it != fresh.end() && !fresh.count(alias)) aliases[alias] = it->second;
  auto out = formats::deepspeed::with_module_leaves(module, fresh);
  if (!aliases.empty()) out = formats::deepspeed::with_module_leaves(out, aliases);
  for (const auto& [gi, si] : mr.module) {  // parameters the template has no entry for, in module order
    const auto& name = model_.params[mr.groups[gi].slots[si].param].name;
    if (auto it = fresh.find(name); it != fresh.end()) {
      formats::deepspeed::insert_module_leaf(out, name, it->second);
      fresh.erase(it);
    }
  }
  return out;
}

// param_shapes of `mr`: its dense groups, then EP rank 0's expert groups where the native-MoE line
// (engine.py v0.19.3:5102-5135) or AutoEP (v0.19.5:5244-5284) records them.
formats::deepspeed::ParamShapes DeepSpeedWriter::target_param_shapes(const MpRankPlan& mr) const {
  formats::deepspeed::ParamShapes out;
  auto add = [&](const GroupPlan& g) {
    auto& shapes = out.emplace_back();
    for (const auto& s : g.slots) shapes.emplace_back(s.name, s.slice.shape);
  };
  for (const auto& g : mr.groups) add(g);
  if ((moe_line_ || model_.autoep) && !mr.expert_groups.empty())
    for (const auto& g : mr.expert_groups[0]) add(g);
  return out;
}

// What a native-MoE version line needs beyond the template (model_states.h to_pickle with a line):
// ds_config, the release asked for, frozen-parameter entries by ZeRO stage, DP rank 0's expert names.
void DeepSpeedWriter::fill_moe_line(const MpRankPlan& mr, formats::deepspeed::ModelStates& m) const {
  const auto& t = plan_.target;
  if (!m.ds_config && !formats::deepspeed::had_ds_config(m))
    m.ds_config = formats::deepspeed::minimal_moe_ds_config(t.zero_stage, t.dtype == DType::BFloat16,
                                                            t.dtype == DType::Float16, plan_.data_before_expert);
  if (!ds_release_.empty()) m.ds_version = ds_release_;
  formats::deepspeed::add_frozen_params(m, t.zero_stage);
  if (mr.expert_groups.empty()) return;
  std::vector<std::pair<int, std::string>> names;  // module order: parameter index in the manifest order
  for (const auto& g : mr.expert_groups[0])
    for (const auto& s : g.slots) names.emplace_back(model_.params[s.param].manifest_index, s.name);
  std::sort(names.begin(), names.end());
  for (auto& [i, n] : names) m.expert_param_names.push_back(std::move(n));
}

ValuePtr DeepSpeedWriter::model_root(int mp, int dp_rank, StorageSources& sources) const {
  const MpRankPlan& mr = plan_.mp_ranks.at(mp);
  const auto& t = plan_.target;
  formats::deepspeed::ModelStates m = formats::deepspeed::read_model_states(
      pickle::deep_copy(template_root(mr.template_file)), model_.model_files.at(mr.template_file));
  if (m.tree) {
    m.tree = target_module(mr, m.tree, sources, formats::deepspeed::shared_params(m));
    m.module = formats::deepspeed::module_tensors(m.tree);
  }
  if (formats::deepspeed::had_param_shapes(m) || moe_line_) m.param_shapes = target_param_shapes(mr);
  const formats::deepspeed::LayoutFacts facts = layout_facts();
  if (model_.autoep) {
    // ZeRO-3: every DP rank's own file records its own EP place (engine.py v0.19.5:5004-5016, :5090).
    const auto [er, edp] = t.zero_stage == 3 && dp_rank >= 0 ? plan_.ep_coords(dp_rank) : std::pair<int, int>{0, 0};
    formats::deepspeed::retarget_autoep(m, facts, er, edp);
  }
  formats::deepspeed::retarget_layout(m, facts, formats::deepspeed::mp_world_size(t.tp, t.pp, model_.pipeline));
  if (!moe_line_) return formats::deepspeed::to_pickle(m);
  fill_moe_line(mr, m);
  return formats::deepspeed::to_pickle(m, *moe_line_);
}

std::vector<LaidOutFile> DeepSpeedWriter::lay_out(const FileJob& j, const std::string& dir) const {
  if (j.kind == FileJob::Zero3Model) return {zero3_model_file(j.dp, j.mp, dir)};
  if (j.kind == FileJob::Optim) return {optim_file(j.dp, j.mp, dir)};
  std::vector<LaidOutFile> out{model_file(j.mp, dir)};
  for (auto& f : layer_files(j.mp, dir)) out.push_back(std::move(f));
  for (auto& f : expert_files(j.mp, dir)) out.push_back(std::move(f));
  return out;
}

LaidOutFile DeepSpeedWriter::model_file(int mp, const std::string& dir) const {
  LaidOutFile f{(fs::path(dir) / plan_.mp_ranks.at(mp).model_file()).string(), nullptr, {}};
  f.root = model_root(mp, -1, f.sources);
  return f;
}

LaidOutFile DeepSpeedWriter::zero3_model_file(int d, int mp, const std::string& dir) const {
  LaidOutFile f{(fs::path(dir) / plan_.zero3_model_file(d, mp)).string(), nullptr, {}};
  f.root = model_root(mp, d, f.sources);
  return f;
}

std::vector<LaidOutFile> DeepSpeedWriter::layer_files(int mp, const std::string& dir) const {
  const MpRankPlan& mr = plan_.mp_ranks.at(mp);
  std::vector<LaidOutFile> out;
  for (const auto& lf : mr.layers) {
    LaidOutFile& f = out.emplace_back();
    f.path = (fs::path(dir) / formats::deepspeed::layer_states_name(lf.layer, mr.tp_rank, plan_.layer_model_axis)).string();
    f.root = Value::dict(true);
    for (const auto& [local, where] : lf.entries)
      f.root->set_item(local, Value::of_tensor(low_precision_slice(mr.groups.at(where.first).slots.at(where.second),
                                                                   &f.sources)));
  }
  return out;
}

std::vector<LaidOutFile> DeepSpeedWriter::expert_files(int mp, const std::string& dir) const {
  const MpRankPlan& mr = plan_.mp_ranks.at(mp);
  std::vector<LaidOutFile> out;
  for (const auto& ef : mr.expert_files) {
    LaidOutFile& f = out.emplace_back();
    f.path = (fs::path(dir) / formats::deepspeed::expert_states_name(ef.moe_id, ef.expert, mp)).string();
    f.root = Value::dict();  // a plain dict: an entry of defaultdict(dict) (engine.py v0.16.5:3373)
    for (const auto& [name, w] : ef.entries) {
      if (w[3] < 0) {
        f.root->set_item(name, Value::of_tensor(low_precision_slice(mr.expert_groups.at(w[0]).at(w[1]).slots.at(w[2]),
                                                                    &f.sources)));
        continue;
      }
      const Slot& row = ef.rows.at(w[3]);  // AutoEP: one expert of a fused weight
      Tensor t = low_precision_slice(row, &f.sources);
      std::vector<int64_t> shape(row.slice.shape.begin() + 1, row.slice.shape.end());
      f.root->set_item(name, Value::of_tensor(Tensor(t.storage(), 0, shape, Tensor::contiguous_strides(shape))));
    }
  }
  for (const auto& name : formats::deepspeed::expected_expert_optim_files(plan_.target.ep, mp, moe_line_)) {
    // Under ZeRO the per-EP-rank optimizer file only says that the optimizer lives in the ZeRO shards.
    auto d = Value::dict();
    d->set_item("optimizer", Value::none());
    out.push_back({(fs::path(dir) / name).string(), d, {}});
  }
  return out;
}

void DeepSpeedWriter::optimizer_state(const GroupPlan& g, int part, formats::deepspeed::OptimizerShard::Group& out,
                                      StorageSources& sources) const {
  out.has_state = true;
  for (const auto& s : g.slots)  // the step of the group's first parameter that has a step.pt
    if (auto step = reader_.step(s.param)) {
      formats::deepspeed::tag_storages_cpu(step);  // a universal step.pt from an older ucp-union may carry cuda:N
      out.step = step;
      break;
    }
  for (size_t k = 1; k < model_.states.size(); ++k)
    out.moments.emplace_back(model_.states[k], partition_tensor(g, part, model_.states[k], -1, true, &sources));
}

ValuePtr DeepSpeedWriter::target_loss_scaler() const {
  auto ls = formats::deepspeed::raw_loss_scaler(common_);
  // fp16 needs a dynamic scaler; other dtypes keep the source's scaler (or a static one).
  const bool dynamic = ls && ls->class_path().find("DynamicLossScaler") != std::string::npos;
  if (!ls || (plan_.target.dtype == DType::Float16) != dynamic) ls = formats::deepspeed::loss_scaler(plan_.target.dtype);
  return ls;
}

ValuePtr DeepSpeedWriter::common_param_groups() const {
  auto g = common_->get("param_groups");
  if (!g || !g->is_sequence()) throw Error("zero/optimizer_state.pt: no param_groups");
  return g;
}

ValuePtr DeepSpeedWriter::zero3_state(int d, int mp, StorageSources& sources) const {
  using formats::deepspeed::OptimizerShard;
  const MpRankPlan& mr = plan_.mp_ranks.at(mp);
  const auto& t = plan_.target;
  const auto common_groups = common_param_groups();
  // Sub-groups: the dense ones (partitioned over DP), then AutoEP's expert sub-groups of this rank's
  // EP rank, partitioned over its expert-DP group (stage3.py v0.19.5:833-880, per parameter group in
  // order; AutoEP's expert group comes after the dense one, moe/utils.py:72-175).
  struct Sub {
    const GroupPlan* g;
    int part;
  };
  std::vector<Sub> subs;
  std::vector<formats::deepspeed::Zero3PartitionGroup> pgroups;
  std::vector<int> all_ranks(t.dp);
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  for (const auto& g : mr.groups) {
    subs.push_back({&g, d});
    pgroups.push_back({t.dp, d, all_ranks, false});
  }
  if (model_.autoep && !mr.expert_groups.empty()) {
    const auto [er, edp] = plan_.ep_coords(d);
    const auto ranks = formats::deepspeed::autoep_expert_dp_ranks(er, t.dp, t.ep, plan_.data_before_expert);
    for (const auto& g : mr.expert_groups.at(er)) {
      subs.push_back({&g, edp});
      pgroups.push_back({g.partition_count, edp, ranks, true});
    }
  }
  OptimizerShard shard;
  shard.flavor = OptimizerShard::Flavor::Zero3;
  for (const auto& sub : subs) {
    auto& group = shard.groups.emplace_back();
    optimizer_state(*sub.g, sub.part, group, sources);
    group.fp32 = partition_tensor(*sub.g, sub.part, "fp32", -1, true, &sources);
  }
  // One entry per optimizer param group, listing its sub-groups (DeepSpeed's
  // _set_fp32_optimizer_param_groups), groups without parameters included.
  for (size_t gi = 0; gi < common_groups->items.size(); ++gi) {
    auto h = pickle::deep_copy(common_groups->items[gi]);
    if (h->kind == Kind::Dict) {
      auto ids = Value::list();
      for (size_t sg = 0; sg < subs.size(); ++sg)
        if (subs[sg].g->group == static_cast<int>(gi)) ids->items.push_back(Value::integer(static_cast<int64_t>(sg)));
      h->set_item("params", ids);
      if (model_.autoep) formats::deepspeed::rename_expert_group(h, formats::deepspeed::autoep_group_name(t.ep));
    }
    shard.param_groups.push_back(h);
  }
  shard.zero_stage = formats::deepspeed::zero_stage_enum(3);
  shard.loss_scaler = target_loss_scaler();
  shard.dynamic_loss_scale = Value::boolean(t.dtype == DType::Float16);
  auto ov = formats::deepspeed::raw_overflow(common_);
  shard.overflow = ov ? ov : Value::boolean(false);
  shard.partition_count = t.dp;
  // Written only when a sub-group holds AutoEP experts (stage3.py v0.19.5:3117-3144).
  if (model_.autoep && pgroups.size() > mr.groups.size()) {
    shard.partition_groups = std::move(pgroups);
    shard.expert_group_name = formats::deepspeed::autoep_group_name(t.ep);
  }
  return formats::deepspeed::to_pickle(shard);
}

LaidOutFile DeepSpeedWriter::optim_file(int d, int mp, const std::string& dir) const {
  const MpRankPlan& mr = plan_.mp_ranks.at(mp);
  const auto& t = plan_.target;
  auto ver = target_ds_version();
  LaidOutFile f{(fs::path(dir) / plan_.optim_file(d, mp)).string(), nullptr, {}};
  ValuePtr osd = t.zero_stage == 3 ? zero3_state(d, mp, f.sources) : zero12_state(d, mp, f.sources);
  const ValuePtr& tmpl = template_root(mr.template_file);
  ValuePtr cfg;
  if (auto source_cfg = formats::deepspeed::raw_ds_config(tmpl)) {
    cfg = formats::deepspeed::retarget_ds_config(source_cfg, layout_facts());
  } else {
    // Native MoE model files before 0.19.3 carry no ds_config.
    cfg = formats::deepspeed::minimal_moe_ds_config(t.zero_stage, t.dtype == DType::BFloat16, t.dtype == DType::Float16,
                                                    plan_.data_before_expert);
  }
  f.root = formats::deepspeed::optimizer_file_root(std::move(osd), std::move(cfg), std::move(ver));
  return f;
}

ValuePtr DeepSpeedWriter::zero12_state(int d, int mp, StorageSources& sources) const {
  using formats::deepspeed::OptimizerShard;
  const MpRankPlan& mr = plan_.mp_ranks.at(mp);
  const auto& t = plan_.target;
  const auto common_groups = common_param_groups();
  // Dense groups partitioned over DP, then (native MoE) this rank's expert groups over expert-DP.
  std::vector<std::pair<const GroupPlan*, int>> groups;
  for (const auto& g : mr.groups) groups.push_back({&g, d});
  if (!mr.expert_groups.empty()) {
    const auto [er, edp] = plan_.ep_coords(d);
    for (const auto& g : mr.expert_groups.at(er)) groups.push_back({&g, edp});
  }
  OptimizerShard shard;
  shard.flavor = t.bf16_optimizer ? OptimizerShard::Flavor::Bf16Optimizer : OptimizerShard::Flavor::Zero12;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const GroupPlan& g = *groups[gi].first;
    const int p = groups[gi].second;
    const PartitionPlan part = partition_of(g, p);
    auto& group = shard.groups.emplace_back();
    optimizer_state(g, p, group, sources);
    if (g.group >= (int)common_groups->items.size())
      throw Error("zero/optimizer_state.pt: no param_groups entry for group " + std::to_string(g.group));
    auto h = pickle::deep_copy(common_groups->items[g.group]);
    if (h->kind == Kind::Dict) {
      h->set_item("params", Value::list({Value::integer(static_cast<int64_t>(gi))}));
      formats::deepspeed::rename_expert_group(h, formats::deepspeed::expert_group_name(t.ep));
    }
    shard.param_groups.push_back(h);
    // ZeRO-1/2 drop the padding from the fp32 partition; BF16_Optimizer keeps it.
    group.fp32 = partition_tensor(g, p, "fp32", t.bf16_optimizer ? -1 : g.partition - part.padding, true, &sources);
    for (const auto& f : part.fragments) group.fragments.push_back({g.slots[f.slot].name, f.start, f.numel});
    group.padding = part.padding;
    group.partition_count = g.partition_count;
  }
  if (!t.bf16_optimizer) {
    shard.loss_scaler = target_loss_scaler();
    shard.dynamic_loss_scale = Value::boolean(t.dtype == DType::Float16);
    auto ov = formats::deepspeed::raw_overflow(common_);
    shard.overflow = ov ? ov : Value::boolean(false);
    shard.zero_stage = formats::deepspeed::zero_stage_enum(t.zero_stage);
  }
  auto clip = formats::deepspeed::raw_clip_grad(common_);
  shard.clip_grad = clip ? clip : Value::real(1.0);
  shard.ds_version = target_ds_version();
  return formats::deepspeed::to_pickle(shard);
}

}  // namespace ucpkit::reshard
