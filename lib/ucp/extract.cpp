// Extract: checkpoint metadata -> plan; plan -> work folder.
#include "ucp/extract.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/json_input.h"
#include "io/torch/torch_file.h"
#include "layout/deepspeed/autoep.h"
#include "layout/deepspeed/files.h"
#include "layout/deepspeed/module_tree.h"
#include "layout/deepspeed/moe.h"
#include "layout/deepspeed/pipeline.h"
#include "layout/deepspeed/version_line.h"
#include "ucp/shard_agreement.h"
#include "ucp/shard_reader.h"
#include "ucp/value_json.h"

namespace fs = std::filesystem;

namespace ucpkit::ucp {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

int64_t numel_of(const std::vector<int64_t>& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<>());
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// name -> TP-local shape of one model-parallel rank: param_shapes when present; else (native MoE
// files before DeepSpeed 0.19.3) the module tensors, flat or Megatron's nested dict, and the expert files.
void collect_shapes(const ValuePtr& model, std::map<std::string, std::vector<int64_t>>& shapes) {
  if (auto ps = model->get("param_shapes"); ps && ps->is_sequence()) {
    for (const auto& group : ps->items)
      if (group && group->kind == Kind::Dict)
        for (const auto& [k, v] : group->entries) shapes[k->as_str()] = v->as_shape();
    return;
  }
  if (auto ps = model->get("param_shapes"); ps && ps->kind == Kind::Dict) {
    for (const auto& [k, v] : ps->entries) shapes[k->as_str()] = v->as_shape();
    return;
  }
  for (const auto& [name, v] : layout::module_tensors(model->get("module"))) shapes[name] = v->tensor->shape();
}

// mp_world_size and Megatron's args against the degrees the file names give.
void check_model_parallel_sizes(const ValuePtr& root, const std::string& path, const layout::DeepSpeedLayout& L) {
  if (auto v = root->get("mp_world_size"); v && !v->is_none() && v->as_int() != L.tp && v->as_int() != L.tp * L.pp)
    fail(path, "inconsistent world sizes: mp_world_size is " + std::to_string(v->as_int()) + " but the files say tp=" +
                   std::to_string(L.tp));
  if (auto args = root->get("args"); args && args->kind == Kind::Object) {
    auto check = [&](const char* field, int expect) {
      if (auto a = args->attr(field); a && a->kind == Kind::Int && a->i != expect)
        fail(path, std::string("inconsistent world sizes: args.") + field + " is " + std::to_string(a->i) +
                       " but the files say " + std::to_string(expect));
    };
    check("tensor_model_parallel_size", L.tp);
    check("pipeline_model_parallel_size", L.pp);
  }
}

}  // namespace

// Patterns: an explicit file wins; else the checkpoint's own.
static patterns::PatternSet choose_patterns(const ExtractOptions& options, const ValuePtr& uc_info,
                                     const layout::DeepSpeedLayout& L, Plan& plan) {
  nlohmann::json pj;
  if (!options.patterns_file.empty()) {
    std::ifstream in(options.patterns_file);
    if (!in) throw Error(options.patterns_file + ": cannot read pattern file");
    try {
      in >> pj;
    } catch (const std::exception& e) {
      throw Error(options.patterns_file + ": not valid JSON: " + e.what());
    }
    plan.patterns_origin = options.patterns_file;
    if (uc_info) {
      auto info = value_to_json(uc_info);
      for (const char* k : {"original_vocab_size", "padded_vocab_size"})
        if (!pj.contains(k) && info.contains(k)) pj[k] = info[k];
    }
  } else if (uc_info && uc_info->kind == Kind::Dict) {
    pj = value_to_json(uc_info);
    plan.patterns_origin = "checkpoint";
  } else {
    if (L.tp > 1)
      throw UsageError(L.model_files[0] + ": no universal_checkpoint_info in the checkpoint and tp=" +
                       std::to_string(L.tp) + ": pass --patterns <patterns/*.json>");
    pj = nlohmann::json::object();
    plan.patterns_origin = "none";
  }
  patterns::PatternSet pset = patterns::PatternSet::from_json(pj, plan.patterns_origin);
  plan.patterns_json = pset.to_json();
  // A pattern file's PipelineModule layer numbering travels with the set (ucp-load's fallback when
  // the layer files say nothing, layout/deepspeed/pipeline.h).
  if (pj.is_object() && pj.contains("pipeline_numbering")) plan.patterns_json["pipeline_numbering"] = pj["pipeline_numbering"];
  return pset;
}


// The AutoEP layers as the manifest lists them under source.autoep.
static nlohmann::json autoep_source_json(const std::vector<layout::AutoEpLayer>& autoep) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& a : autoep)
    layers.push_back({{"moe_layer_id", a.moe_layer_id}, {"module_path", a.module_path},
                      {"expert_key_prefix", a.expert_key_prefix}, {"num_experts", a.num_experts},
                      {"num_local_experts", a.num_local_experts}, {"ep_size", a.ep_size}});
  return layers;
}

// ZeRO-3: every parameter is split on its own into ceil(numel/dp) slices (padding at the end);
// a rank's flat sub-group is the concatenation of its slices, in param_shapes order. With tensor
// parallelism (Megatron-DeepSpeed, AutoTP) each TP rank t writes its own
// zero_pp_rank_<dp>_mp_rank_<t>_* files whose param_shapes are that rank's TP-slice shapes: the
// TP slice is assembled from its DP slices, then the slices are joined across TP by the patterns
// as for ZeRO-1/2 (what ds_to_universal's merge_tp_slices does for stage 3 with tp_degree > 1).
static Plan plan_zero3(const layout::DeepSpeedLayout& L, const ExtractOptions& options) {
  if (L.pipeline || L.pp != 1)
    throw Error(L.dir + ": ZeRO-3 with pipeline parallelism is not supported (DeepSpeed's PipelineEngine "
                        "refuses ZeRO stage 2 and 3, so such checkpoints are not written)");
  using SubGroups = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;
  Plan plan;
  std::vector<SubGroups> sub_groups(L.tp);  // [tp][sub-group]
  ValuePtr uc_info;
  ShardAgreement agreement;
  // AutoEP (partition-native, docs/formats.md "AutoEP under ZeRO-3"): each DP rank's model file
  // records that rank's EP rank and expert-DP rank per layer (engine.py:4986-5017, :5090).
  std::vector<std::vector<layout::AutoEpLayer>> autoep_of_rank(L.dp);
  // Every DP rank's model file (weights-free under ZeRO-3: pickles only) must be of the same save.
  for (size_t t = 0; t < L.zero3_model_files.size(); ++t)
    for (size_t d = 0; d < L.zero3_model_files[t].size(); ++d) {
      const std::string& path = L.zero3_model_files[t][d];
      FileScope scope(path);
      ValuePtr root = load_torch(path);
      agreement.model_file(root, path);
      ValuePtr a = root && root->kind == Kind::Dict ? root->get("ds_autoep_layers") : nullptr;
      const bool has = a && !a->is_none();
      if (has && L.tp > 1)
        fail(path, "DeepSpeed AutoEP under ZeRO-3 with tp=" + std::to_string(L.tp) +
                       ": DeepSpeed refuses AutoEP with AutoTP under ZeRO-3 (engine.py:1850-1853), so such "
                       "checkpoints are not written");
      if (t == 0 && d < autoep_of_rank.size() && has) {
        autoep_of_rank[d] = layout::parse_autoep_layers(a, path);
        layout::check_autoep_zero3_layers(autoep_of_rank[d], path);
      }
      if (t == 0 && d > 0 && has != !autoep_of_rank[0].empty())
        fail(path, std::string(has ? "has" : "has no") + " ds_autoep_layers but " + L.zero3_model_files[0][0] +
                       (has ? " has none" : " has"));
    }
  const std::vector<layout::AutoEpLayer>& autoep = autoep_of_rank[0];
  std::map<std::string, size_t> autoep_param;  // "<prefix>.w1" -> layer index
  for (size_t i = 0; i < autoep.size(); ++i) {
    for (int d = 1; d < L.dp; ++d) {
      const auto& o = autoep_of_rank[d];
      if (o.size() != autoep.size() || o[i].expert_key_prefix != autoep[i].expert_key_prefix ||
          o[i].num_experts != autoep[i].num_experts || o[i].ep_size != autoep[i].ep_size ||
          o[i].moe_layer_id != autoep[i].moe_layer_id)
        fail(L.zero3_model_files[0][d], "ds_autoep_layers differ from " + L.zero3_model_files[0][0] +
                                            " in more than the saving rank's place (files of different saves?)");
    }
    if (L.dp % autoep[i].ep_size != 0 || autoep[i].expert_data_parallel_world_size != L.dp / autoep[i].ep_size)
      fail(L.zero3_model_files[0][0], "ds_autoep_layers (" + autoep[i].expert_key_prefix + "): ep_size " +
                                          std::to_string(autoep[i].ep_size) + " and expert_data_parallel_world_size " +
                                          std::to_string(autoep[i].expert_data_parallel_world_size) + " do not fit " +
                                          std::to_string(L.dp) + " DP ranks");
    for (const auto& w : layout::autoep_weight_names()) autoep_param[autoep[i].expert_key_prefix + "." + w] = i;
  }
  for (int t = 0; t < L.tp; ++t) {
    const std::string& model_path = L.zero3_model_files[t][0];
    FileScope scope(model_path);
    ValuePtr model = load_torch(model_path);
    if (!model || model->kind != Kind::Dict) fail(model_path, "not a model-states dict");
    if (auto v = model->get("dp_world_size"); v && !v->is_none() && v->as_int() != L.dp)
      fail(model_path, "inconsistent world sizes: dp_world_size is " + std::to_string(v->as_int()) + " but " +
                           std::to_string(L.dp) + " ZeRO-3 shards were found");
    check_model_parallel_sizes(model, model_path, L);
    auto ps = model->get("param_shapes");
    if (!ps || !ps->is_sequence()) fail(model_path, "ZeRO-3 model states have no param_shapes list");
    for (const auto& g : ps->items) {
      if (!g || g->kind != Kind::Dict) fail(model_path, "param_shapes entry is not a dict");
      auto& row = sub_groups[t].emplace_back();
      for (const auto& [k, v] : g->entries) row.emplace_back(k->as_str(), v->as_shape());
    }
    if (t == 0) uc_info = model->get("universal_checkpoint_info");
  }
  const patterns::PatternSet pset = choose_patterns(options, uc_info, L, plan);
  // Parameters in TP rank 0's param_shapes order; every TP rank must list the same names.
  std::map<std::string, size_t> index;
  for (const auto& row : sub_groups[0])
    for (const auto& [name, shape] : row) {
      if (!index.emplace(name, plan.params.size()).second)
        fail(L.zero3_model_files[0][0], "parameter " + name + " listed twice in param_shapes");
      ParamPlan p;
      p.name = name;
      p.tp_shapes.assign(L.tp, {});
      p.fragments.assign(L.tp, {});
      if (auto a = autoep_param.find(name); a != autoep_param.end()) {
        p.autoep_experts = autoep[a->second].num_experts;
        p.moe_layer = autoep[a->second].moe_layer_id;
      }
      plan.params.push_back(std::move(p));
    }
  for (const auto& [name, layer] : autoep_param)  // engine.py:5103-5111 checks the same when saving
    if (!index.count(name))
      fail(L.zero3_model_files[0][0], "AutoEP expert weight " + name + " is not in param_shapes");
  for (int t = 0; t < L.tp; ++t) {
    size_t listed = 0;
    for (const auto& row : sub_groups[t])
      for (const auto& [name, shape] : row) {
        auto it = index.find(name);
        if (it == index.end())
          fail(L.zero3_model_files[t][0], "parameter " + name + " is not in tp rank 0's param_shapes");
        ParamPlan& p = plan.params[it->second];
        p.tp_shapes[t] = shape;
        if (p.autoep_experts > 0) {  // [E_local, ...] on every rank (ds_shape); the universal form is [E, ...]
          const auto& a = autoep[autoep_param.at(name)];
          if (shape.empty() || shape[0] != a.num_local_experts)
            fail(L.zero3_model_files[t][0], "AutoEP expert weight " + name + " has shape " + shape_str(shape) +
                                                " but ds_autoep_layers says " + std::to_string(a.num_local_experts) +
                                                " local experts");
          p.tp_shapes[t][0] = a.num_experts;
        }
        ++listed;
      }
    if (listed != plan.params.size())
      fail(L.zero3_model_files[t][0], "param_shapes lists " + std::to_string(listed) + " parameters but tp rank 0's lists " +
                                          std::to_string(plan.params.size()));
  }
  for (int t = 0; t < L.tp; ++t)
    for (int d = 0; d < L.dp; ++d) {
      const std::string& path = L.optim_files[t][d];
      FileScope scope(path);
      const ValuePtr root = load_torch(path);
      ShardView shard(root, path);
      if (!shard.zero3()) fail(path, "ZeRO-3 model files but this optimizer shard is not ZeRO-3");
      if (auto pc = shard.group_info(0).partition_count; pc >= 0 && pc != L.dp)
        fail(path, "inconsistent world sizes: partition_count is " + std::to_string(pc) + " but " +
                       std::to_string(L.dp) + " shards were found");
      const auto& groups = sub_groups[t];
      if (shard.groups() != static_cast<int>(groups.size()))
        fail(path, std::to_string(shard.groups()) + " sub-groups but param_shapes lists " + std::to_string(groups.size()));
      // AutoEP: sub-groups of expert weights are partitioned over the expert-DP group
      // (stage3.py:833-880), recorded in ds_zero_partition_groups (stage3.py:3117-3144).
      const auto pgroups = layout::parse_zero3_partition_groups(shard.optimizer_state_dict(), path);
      if ((!autoep.empty() || !pgroups.empty()) && pgroups.size() != groups.size())
        fail(path, "ZeRO-3 shard: ds_zero_partition_groups lists " + std::to_string(pgroups.size()) +
                       " sub-groups but param_shapes lists " + std::to_string(groups.size()));
      const int file_index = static_cast<int>(plan.files.size());
      plan.files.push_back(path);
      for (int g = 0; g < shard.groups(); ++g) {
        int64_t offset = 0;
        const bool expert_group = !pgroups.empty() && pgroups[g].autoep_expert;
        const int count = pgroups.empty() ? L.dp : pgroups[g].partition_count;
        const int prank = pgroups.empty() ? d : pgroups[g].partition_rank;
        if (!expert_group && (count != L.dp || prank != d))
          fail(path, "sub-group " + std::to_string(g) + " is partition " + std::to_string(prank) + " of " +
                         std::to_string(count) + " but dense sub-groups are partitioned over all " + std::to_string(L.dp) +
                         " DP ranks (this is DP rank " + std::to_string(d) + ")");
        for (const auto& [name, shape] : groups[g]) {
          ParamPlan& p = plan.params[index.at(name)];
          if ((p.autoep_experts > 0) != expert_group)
            fail(path, "sub-group " + std::to_string(g) + (expert_group ? " is an AutoEP expert sub-group but holds " :
                                                                          " is a dense sub-group but holds AutoEP expert weight ") +
                           name);
          int part = d;  // the slice's place in its parameter's join order
          const int64_t n = numel_of(shape);  // expert weights: this EP rank's [E_local, ...]
          if (expert_group) {
            // This rank's fused [E_local, ...] weight of EP rank r, partition prank of the expert-DP
            // group: the parameter's slices in part order r*(DP/EP) + prank give [E, ...]
            // (ds_to_universal.py:654-707 joins the same way).
            const auto& a = autoep_of_rank[d][autoep_param.at(name)];
            if (count != a.expert_data_parallel_world_size || prank != a.expert_data_parallel_rank)
              fail(path, "sub-group " + std::to_string(g) + " is partition " + std::to_string(prank) + " of " +
                             std::to_string(count) + " but " + L.zero3_model_files[t][d] + " records expert-DP rank " +
                             std::to_string(a.expert_data_parallel_rank) + " of " +
                             std::to_string(a.expert_data_parallel_world_size));
            part = a.ep_rank * count + prank;
          }
          const int64_t per = (n + count - 1) / count;
          const int64_t have = std::max<int64_t>(0, std::min(per, n - prank * per));
          if (t == 0 && d == 0) {
            p.states = shard.states(g);
            if (shard.has_step(g)) {
              p.step_file = file_index;
              p.step_group = g;
            }
          } else if (shard.states(g) != p.states) {
            fail(path, "parameter " + name + ": sub-group " + std::to_string(g) +
                           " holds other optimizer states than tp rank 0, dp rank 0");
          }
          if (have > 0) p.fragments[t].push_back({file_index, g, offset, have, part});
          offset += per;
        }
        if (offset != shard.state_tensor(g, "fp32").numel())
          fail(path, "sub-group " + std::to_string(g) + " holds " + std::to_string(shard.state_tensor(g, "fp32").numel()) +
                         " elements but its parameters need " + std::to_string(offset));
      }
      agreement.optim_shard(shard, root, path);
    }
  agreement.finish();
  for (auto& p : plan.params)
    for (int t = 0; t < L.tp; ++t) {
      auto& fr = p.fragments[t];
      std::stable_sort(fr.begin(), fr.end(), [](const Fragment& a, const Fragment& b) { return a.part < b.part; });
      for (size_t i = 1; i < fr.size(); ++i)
        if (fr[i].part == fr[i - 1].part)
          throw Error(plan.files[fr[i].file] + ": parameter " + p.name + " partition " + std::to_string(fr[i].part) +
                      " is also in " + plan.files[fr[i - 1].file] + " (two ranks claim the same EP rank and expert-DP rank)");
      int64_t have = 0;
      for (const auto& f : p.fragments[t]) have += f.numel;
      if (have != numel_of(p.tp_shapes[t]))
        throw Error(L.dir + ": parameter " + p.name + (L.tp > 1 ? " tp rank " + std::to_string(t) : std::string()) +
                    ": ZeRO-3 slices hold " + std::to_string(have) + " of " + std::to_string(numel_of(p.tp_shapes[t])) +
                    " elements");
    }
  if (L.tp > 1) {  // the joins use the patterns: a pattern matching no parameter is reported
    std::set<std::string> used;
    for (const auto& p : plan.params)
      for (const auto& s : patterns::classify(pset, p.name).matched) used.insert(s);
    for (const auto& s : pset.all_sources())
      if (!used.count(s)) plan.unused_patterns.push_back(s);
  }
  plan.model_files.clear();
  for (const auto& row : L.zero3_model_files)
    for (const auto& f : row) plan.model_files.push_back(f);
  plan.optimizer_state_file = L.optim_files[0][0];
  plan.source = {{"dir", fs::absolute(L.dir).string()}, {"tag", L.tag}, {"tp", L.tp}, {"pp", 1}, {"dp", L.dp},
                 {"ep", 1}, {"zero_stage", 3}, {"pipeline", false}, {"bf16", L.bf16_prefix},
                 {"sub_groups", sub_groups[0].size()}};
  if (!autoep.empty()) {
    plan.source["ep"] = autoep[0].ep_size;
    plan.source["autoep"] = autoep_source_json(autoep);
  }
  return plan;
}

// Layer-file numbering of a PipelineModule source, read from its own files: which layer_NN holds
// the tied embedding and the tied head (their names carry no index), blocks and final norm from the
// parameter names. Every TP-rank-0 layer file is opened (keys only): `keys` gets each file's key order
// (the layer module's registration order, which the target's layer files keep).
layout::PipelineNumbering pipeline_numbering_of(const layout::DeepSpeedLayout& L, const Plan& plan,
                                                std::map<int, std::vector<std::string>>& keys) {
  std::set<int> numbered, blocks;
  std::set<std::string> tied;
  for (const auto& p : plan.params) {
    const auto [idx, local] = layout::split_pipeline_name(p.name);
    if (idx >= 0) {
      numbered.insert(idx);
      if (layout::is_block_local(local)) blocks.insert(idx);
    } else if (idx == -1) {
      tied.insert(local);
    }
  }
  for (const auto& [idx, files] : L.layer_files) {
    if (files.empty()) continue;
    FileScope scope(files[0]);
    ValuePtr root = load_torch(files[0]);
    auto& k = keys[idx];
    if (root && root->kind == Kind::Dict)
      for (const auto& [key, v] : root->entries) k.push_back(key->as_str());
  }
  try {
    return layout::detect_pipeline_numbering(keys, numbered, blocks, tied);
  } catch (const Error& e) {
    throw Error(L.dir + ": " + e.what());
  }
}

// AutoEP under ZeRO-1/2 (docs/formats.md "AutoEP"): TP = PP = 1; num_experts lists each layer's E;
// the expert group's param_shapes hold [num_local_experts, ...] for <prefix>.w1/w2/w3; and exactly the
// files layer_<id>_expert_<g>_mp_rank_00_model_states.pt, g < E, each holding <prefix>.w{1,2,3}.<g> of
// that shape without the expert dimension (engine.py:5029-5054). Fills `param` (weight -> layer index).
void check_autoep_files(const layout::DeepSpeedLayout& L, const std::vector<layout::AutoEpLayer>& autoep,
                        const std::vector<int>& num_experts, const std::map<std::string, std::vector<int64_t>>& shapes,
                        std::map<std::string, size_t>& param) {
  if (L.tp > 1 || L.pp > 1 || L.pipeline)
    throw Error(L.dir + ": DeepSpeed AutoEP with tp=" + std::to_string(L.tp) + " pp=" + std::to_string(L.pp) +
                " is not supported (only tp=1, pp=1; ds_to_universal refuses it too, autoep_universal.py:281-283)");
  if (num_experts.size() != autoep.size())
    fail(L.model_files[0], "num_experts lists " + std::to_string(num_experts.size()) + " layers but ds_autoep_layers " +
                               std::to_string(autoep.size()) + " (models mixing native MoE and AutoEP are not supported)");
  std::map<int, size_t> by_id;
  for (size_t i = 0; i < autoep.size(); ++i) {
    const auto& a = autoep[i];
    by_id[a.moe_layer_id] = i;
    if (num_experts[i] != a.num_experts)
      fail(L.model_files[0], "num_experts[" + std::to_string(i) + "] is " + std::to_string(num_experts[i]) +
                                 " but ds_autoep_layers says " + std::to_string(a.num_experts) + " for " + a.expert_key_prefix);
    for (const auto& w : layout::autoep_weight_names()) {
      const std::string name = a.expert_key_prefix + "." + w;
      auto sh = shapes.find(name);
      if (sh == shapes.end()) fail(L.model_files[0], "AutoEP expert weight " + name + " is not in param_shapes");
      if (sh->second.empty() || sh->second[0] != a.num_local_experts)
        fail(L.model_files[0], "AutoEP expert weight " + name + " has shape " + shape_str(sh->second) +
                                   " in param_shapes; expected num_local_experts " + std::to_string(a.num_local_experts) +
                                   " in dim 0");
      param[name] = i;
    }
  }
  std::set<std::pair<int, int>> found;
  for (const auto& ef : L.expert_files) {
    auto it = by_id.find(ef.moe_layer);
    if (it == by_id.end() || ef.expert >= autoep[it->second].num_experts || ef.mp != 0)
      fail(ef.path, "extra shard: no such AutoEP layer/expert in ds_autoep_layers");
    const auto& a = autoep[it->second];
    FileScope scope(ef.path);
    ValuePtr root = load_torch(ef.path);
    if (!root || root->kind != Kind::Dict) fail(ef.path, "not an expert state dict");
    std::set<std::string> want;
    for (const auto& w : layout::autoep_weight_names()) want.insert(layout::autoep_expert_file_key(a.expert_key_prefix, w, ef.expert));
    for (const auto& [k, v] : root->entries) {
      if (!k || k->kind != Kind::Str) fail(ef.path, "expert state dict has a non-string key");
      if (k->s == "folding") fail(ef.path, "folded AutoEP+AutoTP expert shards are not supported (autoep_universal.py:201-207)");
      if (!want.erase(k->s)) fail(ef.path, "unexpected key " + k->s + " (expected " + a.expert_key_prefix + ".w1/w2/w3." + std::to_string(ef.expert) + ")");
      if (!v || v->kind != Kind::Tensor) fail(ef.path, k->s + " is not a tensor");
      const std::string w = k->s.substr(a.expert_key_prefix.size() + 1, 2);
      std::vector<int64_t> local = shapes.at(a.expert_key_prefix + "." + w);
      local.erase(local.begin());
      if (v->tensor->shape() != local)
        fail(ef.path, k->s + " has shape " + shape_str(v->tensor->shape()) + " but param_shapes gives " + shape_str(local) + " per expert");
    }
    if (!want.empty()) fail(ef.path, "missing key " + *want.begin());
    found.emplace(a.moe_layer_id, ef.expert);
  }
  for (const auto& a : autoep)
    for (int e = 0; e < a.num_experts; ++e)
      if (!found.count({a.moe_layer_id, e}))
        fail((fs::path(L.dir) / layout::autoep_expert_file_name(a.moe_layer_id, e)).string(),
             "missing shard (AutoEP layer " + a.expert_key_prefix + " expert " + std::to_string(e) + " of " +
                 std::to_string(a.num_experts) + ")");
}

Plan plan_checkpoint(const std::string& checkpoint, const ExtractOptions& options) {
  const layout::DeepSpeedLayout L = layout::discover(checkpoint);
  if (L.zero3) return plan_zero3(L, options);
  Plan plan;
  auto refuse_moe_model_parallel = [&] {
    throw Error(L.dir + ": native DeepSpeed MoE with tp=" + std::to_string(L.tp) + " pp=" + std::to_string(L.pp) +
                " is not supported (only tp=1, pp=1: expert numbering across tensor/pipeline ranks is not handled)");
  };
  if ((!L.expert_files.empty() || !L.expert_optim_files.empty()) && (L.tp > 1 || L.pp > 1 || L.pipeline))
    refuse_moe_model_parallel();

  // Model states of every (pp, tp): shapes, world sizes, patterns.
  std::vector<std::map<std::string, std::vector<int64_t>>> shapes(L.mp_count());
  ValuePtr uc_info;
  std::vector<int> num_experts;
  bool data_before_expert = false;
  layout::MoeFileFacts facts;  // what DeepSpeed version line the native MoE files follow
  facts.expp_files = !L.expert_optim_files.empty();
  ShardAgreement agreement;  // every file of one save; every shard's partitions fully described
  std::vector<layout::AutoEpLayer> autoep;  // DeepSpeed AutoEP layers (ds_autoep_layers is a list)
  for (int mp = 0; mp < L.mp_count(); ++mp) {
    const auto& path = L.model_files[mp];
    FileScope scope(path);
    ValuePtr root = load_torch(path);
    if (!root || root->kind != Kind::Dict) fail(path, "not a model-states dict");
    if (auto v = root->get("dp_world_size"); v && !v->is_none() && v->as_int() != L.dp) {
      if (v->as_int() > 0 && v->as_int() < L.dp)
        throw Error(L.optim_files[mp][v->as_int()] + ": extra shard: " + path + " says dp_world_size is " +
                    std::to_string(v->as_int()) + " but ZeRO shards up to rank " + std::to_string(L.dp - 1) +
                    " were found");
      fail(path, "inconsistent world sizes: dp_world_size is " + std::to_string(v->as_int()) + " but " +
                     std::to_string(L.dp) + " ZeRO shards per model-parallel rank were found");
    }
    check_model_parallel_sizes(root, path, L);
    agreement.model_file(root, path);
    if (mp == 0) {
      uc_info = root->get("universal_checkpoint_info");
      if (auto ne = root->get("num_experts"); ne && ne->is_sequence())
        for (const auto& x : ne->items) num_experts.push_back(static_cast<int>(x->as_int()));
      facts = layout::moe_file_facts(root, facts.expp_files);
      if (auto a = root->get("ds_autoep_layers"); a && !a->is_none()) {
        autoep = layout::parse_autoep_layers(a, path);
        // ds_to_universal.py:877: the rank order comes from the model file's ds_config.
        if (auto cfg = root->get("ds_config"); cfg && cfg->kind == Kind::Dict)
          if (auto f = cfg->get(layout::kUseDataBeforeExpertParallelism); f) {
            if (f->kind != Kind::Bool) fail(path, std::string("ds_config.") + layout::kUseDataBeforeExpertParallelism + " is not a boolean");
            data_before_expert = f->b;
          }
      }
    }
    collect_shapes(root, shapes[mp]);
  }
  // Native DeepSpeed MoE: TP = PP = 1 only; every layer_L_expert_E_mp_rank_XX file of every MoE
  // layer L < len(num_experts) and expert E < num_experts[L] must be there, and no other.
  // AutoEP fused expert weight "<prefix>.w1" -> its layer (index into `autoep`).
  std::map<std::string, size_t> autoep_param;
  if (!autoep.empty()) check_autoep_files(L, autoep, num_experts, shapes[0], autoep_param);
  const bool native_moe = autoep.empty() &&
                          (!L.expert_files.empty() || !L.expert_optim_files.empty() || !num_experts.empty());
  if (native_moe && (L.tp > 1 || L.pp > 1 || L.pipeline)) refuse_moe_model_parallel();
  if (native_moe) {
    if (num_experts.empty()) fail(L.model_files[0], "native MoE expert files but the model states have no num_experts");
    auto expert_file = [&](int layer, int e) {
      return (fs::path(L.dir) / layout::expert_states_name(layer, e, 0)).string();
    };
    std::set<std::pair<int, int>> found;
    for (const auto& ef : L.expert_files) {
      if (ef.moe_layer >= static_cast<int>(num_experts.size()) || ef.expert >= num_experts[ef.moe_layer])
        fail(ef.path, "extra shard: num_experts is " + nlohmann::json(num_experts).dump() + " (per MoE layer)");
      found.emplace(ef.moe_layer, ef.expert);
    }
    for (int layer = 0; layer < static_cast<int>(num_experts.size()); ++layer)
      for (int e = 0; e < num_experts[layer]; ++e)
        if (!found.count({layer, e}))
          fail(expert_file(layer, e), "missing shard (native MoE layer " + std::to_string(layer) + " expert " +
                                          std::to_string(e) + " of " + std::to_string(num_experts[layer]) + ")");
  }
  // Expert parameter (name with expert index 0) -> its MoE layer, from the expert files' keys.
  std::map<std::string, int> moe_layer_of;
  std::map<std::string, std::string> expert_file_of;  // global expert parameter name -> its file
  for (const auto& ef : L.expert_files) {
    if (!autoep.empty()) break;  // checked by check_autoep_files
    FileScope scope(ef.path);
    ValuePtr root = load_torch(ef.path);
    if (!root || root->kind != Kind::Dict) fail(ef.path, "not an expert state dict");
    for (const auto& [k, v] : root->entries)
      if (v && v->kind == Kind::Tensor) {
        const std::string key = k->as_str();
        shapes.at(ef.mp)[key] = v->tensor->shape();
        expert_file_of[key] = ef.path;
        if (layout::local_expert_index(key)) {
          auto [it, fresh] = moe_layer_of.emplace(layout::with_expert_index(key, 0), ef.moe_layer);
          if (!fresh && it->second != ef.moe_layer)
            fail(ef.path, "expert parameter " + key + " also appears in MoE layer " + std::to_string(it->second) + "'s files");
        }
      }
  }

  const patterns::PatternSet pset = choose_patterns(options, uc_info, L, plan);

  // Optimizer shards: fragments of every parameter.
  std::map<std::string, size_t> index;
  std::map<std::string, patterns::ParamRule> rules;
  auto rule_of = [&](const std::string& name) -> const patterns::ParamRule& {
    auto it = rules.find(name);
    if (it == rules.end()) it = rules.emplace(name, patterns::classify(pset, name)).first;
    return it->second;
  };
  int ep_seen = 0;
  int zero_stage = 1;  // BF16_Optimizer shards have no zero_stage
  for (int mp = 0; mp < L.mp_count(); ++mp) {
    const int pp_rank = L.pp_rank(mp), tp_rank = L.tp_rank(mp);
    for (int d = 0; d < L.dp; ++d) {
      const std::string& path = L.optim_files[mp][d];
      FileScope scope(path);
      ValuePtr root = load_torch(path);
      ShardView shard(root, path);
      agreement.optim_shard(shard, root, path);
      if (d == 0 && mp == 0) {
        if (auto z = shard.optimizer_state_dict()->get("zero_stage"); z && !z->is_none()) zero_stage = static_cast<int>(z->as_int());
        if (auto cfg = root->get("ds_config"); cfg && cfg->kind == Kind::Dict)
          // The config key is "use_data_before_expert_parallelism" (deepspeed/runtime/constants.py
          // USE_DATA_BEFORE_EXPERT_PARALLEL); use_data_before_expert_parallel_ is the engine's attribute
          // name, which earlier ucpkit fixtures wrote: both are read.
          for (const char* key : {layout::kUseDataBeforeExpertParallelism, "use_data_before_expert_parallel_"})
            if (auto f = cfg->get(key); f && f->kind == Kind::Bool && autoep.empty()) {
              data_before_expert = f->b;
              break;
            }
      }
      const int file_index = static_cast<int>(plan.files.size());
      plan.files.push_back(path);
      for (int g = 0; g < shard.groups(); ++g) {
        const auto group = shard.group_info(g);
        int part = d, count = L.dp, ep_rank = -1, per = 0;
        if (group.moe) {
          if (group.ep_size <= 0) fail(path, "expert param group " + std::to_string(g) + " has no ep_size_<N> name");
          ep_seen = group.ep_size;
          auto c = layout::ep_coords(d, L.dp, group.ep_size, data_before_expert);
          part = c.edp_rank;
          count = L.dp / group.ep_size;
          ep_rank = c.ep_rank;
        }
        if (group.partition_count >= 0 && group.partition_count != count)
          fail(path, "inconsistent world sizes: param group " + std::to_string(g) + " has partition_count " +
                         std::to_string(group.partition_count) + ", expected " + std::to_string(count));
        agreement.partition("mp rank " + std::to_string(mp) + ", param group " + std::to_string(g) +
                                (ep_rank >= 0 ? ", EP rank " + std::to_string(ep_rank) : std::string()),
                            part, count, shard.state_tensor(g, "fp32").numel(), shard.fragments(g), path);
        for (const auto& [local, start, numel] : shard.fragments(g)) {
          std::string name = local;
          int frag_part = part;  // the fragment's place in its parameter's join order
          int moe_layer = -1, expert = -1;
          const layout::AutoEpLayer* ae = nullptr;
          if (group.moe && !autoep.empty()) {
            // AutoEP: the fused [E_local, ...] weight has the same name on every EP rank; the
            // partitions of EP rank r (its expert-DP group, in rank order) hold experts
            // r*E_local .. (r+1)*E_local-1 (autoep_universal.py:301-328), so part = r * (DP/EP) + edp.
            auto it = autoep_param.find(local);
            if (it == autoep_param.end())
              fail(path, "expert param group " + std::to_string(g) + " holds " + local +
                             ", which is no AutoEP expert weight (<expert_key_prefix>.w1/w2/w3 of ds_autoep_layers)");
            ae = &autoep[it->second];
            if (group.ep_size != ae->ep_size)
              fail(path, "expert param group " + std::to_string(g) + " is ep_size_" + std::to_string(group.ep_size) +
                             " but ds_autoep_layers says ep_size " + std::to_string(ae->ep_size));
            frag_part = ep_rank * count + part;
            moe_layer = ae->moe_layer_id;
          } else if (group.moe) {
            auto j = layout::local_expert_index(local);
            if (!j) fail(path, "expert group holds a non-expert parameter " + local);
            if (L.tp > 1 || L.pp > 1)
              fail(path, "native DeepSpeed MoE with tp > 1 or pp > 1 is not supported");
            auto layer = layout::transformer_layer_index(local);
            auto ml = moe_layer_of.find(layout::with_expert_index(local, 0));
            if (ml == moe_layer_of.end())
              fail(path, "expert parameter " + local + " is in no layer_L_expert_E_mp_rank_00_model_states.pt file");
            if (ml->second >= static_cast<int>(num_experts.size()))
              fail(path, "native MoE layer " + std::to_string(ml->second) + " but num_experts lists " +
                             std::to_string(num_experts.size()) + " layers");
            const int experts = num_experts[ml->second];
            if (experts <= 0 || experts % group.ep_size != 0)
              fail(path, "MoE layer " + std::to_string(ml->second) + ": num_experts " + std::to_string(experts) +
                             " is not a positive multiple of ep_size " + std::to_string(group.ep_size));
            per = experts / group.ep_size;
            if (*j >= per)
              fail(path, "expert parameter " + local + ": local expert index " + std::to_string(*j) + " but only " +
                             std::to_string(per) + " experts per EP rank in MoE layer " + std::to_string(ml->second));
            expert = ep_rank * per + *j;
            moe_layer = layer ? *layer : -1;
            name = layout::with_expert_index(local, expert);
          }
          const auto& rule = rule_of(name);
          if (pp_rank > 0 && rule.pipeline_replicated) continue;
          auto [it, fresh] = index.emplace(name, plan.params.size());
          if (fresh) {
            ParamPlan p;
            p.name = name;
            p.tp_shapes.assign(L.tp, {});
            p.fragments.assign(L.tp, {});
            p.pp_stage = pp_rank;
            p.moe_layer = moe_layer;
            p.expert = expert;
            p.states = shard.states(g);
            if (shard.has_step(g)) {
              p.step_file = file_index;
              p.step_group = g;
            }
            plan.params.push_back(std::move(p));
          }
          ParamPlan& p = plan.params[it->second];
          if (ae) {
            p.autoep_experts = ae->num_experts;
            p.moe_layer = ae->moe_layer_id;
          }
          if (!fresh && p.pp_stage != pp_rank)
            fail(path, "parameter " + name + " appears on pipeline stages " + std::to_string(p.pp_stage) + " and " +
                           std::to_string(pp_rank) + " but matches no pipeline_replicated pattern");
          auto sh = shapes[mp].find(name);
          if (ae) {  // checked against num_local_experts by check_autoep_files
            if (p.tp_shapes[tp_rank].empty()) {
              p.tp_shapes[tp_rank] = sh->second;
              p.tp_shapes[tp_rank][0] = ae->num_experts;
            }
            p.fragments[tp_rank].push_back({file_index, g, start, numel, frag_part});
            continue;
          }
          if (group.moe && (sh == shapes[mp].end() || !expert_file_of.count(name)))
            fail(path, "expert parameter " + name + " (global expert " + std::to_string(expert) +
                           ") is in none of the layer_L_expert_E_mp_rank_00_model_states.pt files");
          if (sh == shapes[mp].end())
            fail(path, "parameter " + name + " has no shape in " + L.model_files[mp] + " (param_shapes/module)");
          if (p.tp_shapes[tp_rank].empty()) p.tp_shapes[tp_rank] = sh->second;
          p.fragments[tp_rank].push_back({file_index, g, start, numel, frag_part});
        }
      }
    }
  }
  (void)ep_seen;
  agreement.finish();

  // Completeness: every TP slice fully covered by its fragments, in partition order.
  for (auto& p : plan.params) {
    for (int t = 0; t < L.tp; ++t) {
      auto& fr = p.fragments[t];
      std::stable_sort(fr.begin(), fr.end(), [](const Fragment& a, const Fragment& b) { return a.part < b.part; });
      for (size_t i = 1; i < fr.size(); ++i)
        if (fr[i].part == fr[i - 1].part)
          throw Error(plan.files[fr[i].file] + ": parameter " + p.name + " appears twice in partition " +
                      std::to_string(fr[i].part) + " (extra shard?)");
      int64_t have = 0;
      for (const auto& f : fr) have += f.numel;
      if (fr.empty())
        throw Error(L.dir + ": parameter " + p.name + " has no fragments for tp rank " + std::to_string(t) +
                    " (missing shard?)");
      if (have != numel_of(p.tp_shapes[t]))
        throw Error(L.dir + ": parameter " + p.name + " tp rank " + std::to_string(t) + ": fragments hold " +
                    std::to_string(have) + " elements but its shape " + shape_str(p.tp_shapes[t]) + " needs " +
                    std::to_string(numel_of(p.tp_shapes[t])) + " (missing or extra shard?)");
    }
  }

  // Unused patterns (strict): a pattern that matches no parameter.
  std::set<std::string> used;
  for (const auto& [n, r] : rules)
    for (const auto& s : r.matched) used.insert(s);
  for (const auto& s : pset.all_sources())
    if (!used.count(s)) plan.unused_patterns.push_back(s);

  plan.model_files = L.model_files;
  plan.optimizer_state_file = L.optim_files[0][0];
  nlohmann::json numbering, layer_keys;
  if (L.pipeline) {
    std::map<int, std::vector<std::string>> keys;
    numbering = layout::to_json(pipeline_numbering_of(L, plan, keys));
    for (const auto& [idx, k] : keys) layer_keys[std::to_string(idx)] = k;
  }
  plan.source = {{"dir", fs::absolute(L.dir).string()}, {"tag", L.tag}, {"tp", L.tp}, {"pp", L.pp}, {"dp", L.dp},
                 {"zero_stage", zero_stage},
                 {"ep", std::max(L.ep, ep_seen > 0 ? ep_seen : 1)}, {"pipeline", L.pipeline},
                 {"bf16", L.bf16_prefix}, {"data_before_expert", data_before_expert},
                 {"num_experts", num_experts}, {"expert_files", L.expert_files.size()}};
  if (!numbering.is_null()) plan.source["pipeline_numbering"] = numbering;
  if (!layer_keys.is_null()) plan.source["layer_keys"] = layer_keys;
  if (native_moe) plan.source["ds_line"] = layout::detect_moe_version_line(facts).name;
  if (!autoep.empty()) {
    plan.source["autoep"] = autoep_source_json(autoep);
    plan.source["expert_files"] = L.expert_files.size();
  }
  return plan;
}

bool is_work_folder(const std::string& dir) { return fs::exists(fs::path(dir) / "plan.json"); }

Plan load_work_plan(const std::string& work_dir) {
  const std::string source = (fs::path(work_dir) / "plan.json").string();
  std::ifstream in(source, std::ios::binary);
  if (!in) throw Error(source + ": cannot read");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = parse_json_input(text.str(), source, "corrupt");
  Plan p;
  try {
    p = Plan::from_json(j);
  } catch (const nlohmann::json::exception& e) {  // a field missing or of another type
    throw Error(source + ": malformed plan: " + escaped_brief(e.what(), 160));
  }
  // write_work_folder names only files inside the folder: any other path (absolute, "..") would make
  // ucp-union read, and copy into its output, a file from anywhere.
  auto inside = [&](std::string& f, const char* what) { f = confined_path(work_dir, f, source, what).string(); };
  for (auto& f : p.files) inside(f, "fragment file");
  for (auto& f : p.model_files) inside(f, "model file");
  inside(p.optimizer_state_file, "optimizer state file");
  return p;
}

}  // namespace ucpkit::ucp
