// ZeRO-3 extract planning (see extract_zero3.h).
#include "to_universal/extract_zero3.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/autoep_json.h"
#include "formats/deepspeed/autoep_zero3_ranks.h"
#include "to_universal/fragment_map.h"
#include "to_universal/plan_source.h"
#include "to_universal/shard_agreement.h"
#include "to_universal/shard_reader.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

// AutoEP (partition-native, docs/formats.md "AutoEP under ZeRO-3"): each DP rank's model file
// records that rank's EP rank and expert-DP rank per layer (engine.py:4986-5017, :5090). Every DP
// rank's model file (weights-free under ZeRO-3: pickles only) must be of the same save (recorded in
// `agreement`).
struct Zero3ModelFiles {
  std::vector<std::vector<formats::deepspeed::AutoEpLayer>> autoep_of_rank;  // ds_autoep_layers per DP rank of TP rank 0 (empty: no AutoEP)
  std::vector<formats::deepspeed::ModelStates> first_of_tp;       // each TP rank's DP-rank-0 model file, as read
};

Zero3ModelFiles read_zero3_model_files(const formats::deepspeed::DeepSpeedLayout& L, ShardAgreement& agreement,
                                       const TorchLoadOptions& open) {
  Zero3ModelFiles out;
  out.autoep_of_rank.resize(L.dp);
  auto& autoep_of_rank = out.autoep_of_rank;
  for (size_t t = 0; t < L.zero3_model_files.size(); ++t)
    for (size_t d = 0; d < L.zero3_model_files[t].size(); ++d) {
      const std::string& path = L.zero3_model_files[t][d];
      FileScope scope(path);
      ValuePtr root = load_torch(path, open);
      agreement.model_file(root, path);
      formats::deepspeed::ModelStates model = formats::deepspeed::read_rank_model_states(root, path);
      const bool has = formats::deepspeed::has_autoep_layers(model);
      if (has && L.tp > 1)
        fail(path, "DeepSpeed AutoEP under ZeRO-3 with tp=" + std::to_string(L.tp) +
                       ": DeepSpeed refuses AutoEP with AutoTP under ZeRO-3 (engine.py:1850-1853), so such "
                       "checkpoints are not written");
      if (t == 0 && d < autoep_of_rank.size() && has) {
        autoep_of_rank[d] = formats::deepspeed::autoep_layers(model, path);
        formats::deepspeed::check_autoep_zero3_layers(autoep_of_rank[d], path);
      }
      if (t == 0 && d > 0 && has != !autoep_of_rank[0].empty())
        fail(path, std::string(has ? "has" : "has no") + " ds_autoep_layers but " + L.zero3_model_files[0][0] +
                       (has ? " has none" : " has"));
      if (d == 0) out.first_of_tp.push_back(std::move(model));
    }
  return out;
}

// The ranks' ds_autoep_layers agree (formats/deepspeed/autoep_zero3_ranks.h). Returns the fused
// expert weight "<prefix>.w1" -> its layer (index into DP rank 0's list).
std::map<std::string, size_t> check_autoep_ranks_agree(const formats::deepspeed::DeepSpeedLayout& L,
                                                      const std::vector<std::vector<formats::deepspeed::AutoEpLayer>>& autoep_of_rank) {
  formats::deepspeed::check_autoep_ranks_agree(autoep_of_rank, L.zero3_model_files[0], L.dp);
  std::map<std::string, size_t> autoep_param;
  for (size_t i = 0; i < autoep_of_rank[0].size(); ++i)
    for (const auto& w : formats::deepspeed::autoep_weight_names())
      autoep_param[autoep_of_rank[0][i].expert_key_prefix + "." + w] = i;
  return autoep_param;
}

// What the DP-rank-0 model file of every TP rank gives the plan.
struct Zero3ModelStates {
  std::vector<SubGroups> sub_groups;  // [tp][sub-group]: param_shapes
  ValuePtr uc_info;                   // TP rank 0's universal_checkpoint_info
};

// `first_of_tp`: those files as read_zero3_model_files read them.
Zero3ModelStates read_zero3_param_shapes(const formats::deepspeed::DeepSpeedLayout& L,
                                         const std::vector<formats::deepspeed::ModelStates>& first_of_tp) {
  Zero3ModelStates out;
  out.sub_groups.resize(L.tp);
  for (int t = 0; t < L.tp; ++t) {
    const std::string& model_path = L.zero3_model_files[t][0];
    FileScope scope(model_path);
    const formats::deepspeed::ModelStates& model = first_of_tp.at(static_cast<size_t>(t));
    if (const auto dp = model.dp_world_size; dp && *dp != L.dp)
      fail(model_path, "inconsistent world sizes: dp_world_size is " + std::to_string(*dp) + " but " +
                           std::to_string(L.dp) + " ZeRO-3 shards were found");
    formats::deepspeed::check_recorded_parallel_sizes(model, model_path, L.tp, L.pp);
    const auto ps = formats::deepspeed::saved_param_shapes(model);
    if (!ps || ps->one_dict) fail(model_path, "ZeRO-3 model states have no param_shapes list");
    if (ps->not_dicts) fail(model_path, "param_shapes entry is not a dict");
    out.sub_groups[t] = ps->groups;
    if (t == 0) out.uc_info = formats::deepspeed::universal_checkpoint_info(model);
  }
  return out;
}

// One optimizer shard (TP rank t, DP rank d): its sub-groups' slices into the plan, after the checks
// that it is a ZeRO-3 shard of this layout whose sub-groups match param_shapes.
void add_zero3_shard(ExtractPlan& plan, const std::map<std::string, size_t>& index, const formats::deepspeed::DeepSpeedLayout& L, int t,
                     int d, const SubGroups& groups, const std::vector<formats::deepspeed::AutoEpLayer>& rank_autoep,
                     const std::map<std::string, size_t>& autoep_param, bool autoep, ShardAgreement& agreement,
                     const TorchLoadOptions& open) {
  const std::string& path = L.optim_files[t][d];
  FileScope scope(path);
  const ValuePtr root = load_torch(path, open);
  ShardView shard(root, path);
  if (!shard.zero3()) fail(path, "ZeRO-3 model files but this optimizer shard is not ZeRO-3");
  if (auto pc = shard.group_info(0).partition_count; pc >= 0 && pc != L.dp)
    fail(path, "inconsistent world sizes: partition_count is " + std::to_string(pc) + " but " + std::to_string(L.dp) +
                   " shards were found");
  if (shard.groups() != static_cast<int>(groups.size()))
    fail(path, std::to_string(shard.groups()) + " sub-groups but param_shapes lists " + std::to_string(groups.size()));
  // AutoEP: sub-groups of expert weights are partitioned over the expert-DP group
  // (stage3.py:833-880), recorded in ds_zero_partition_groups (stage3.py:3117-3144).
  const auto& pgroups = shard.shard().partition_groups;
  if ((autoep || !pgroups.empty()) && pgroups.size() != groups.size())
    fail(path, "ZeRO-3 shard: ds_zero_partition_groups lists " + std::to_string(pgroups.size()) +
                   " sub-groups but param_shapes lists " + std::to_string(groups.size()));
  const int file_index = plan.add_file(path);
  for (int g = 0; g < shard.groups(); ++g) {
    Zero3SubGroup sub;
    sub.file = file_index;
    sub.group = g;
    sub.tp_rank = t;
    sub.dp_rank = d;
    sub.autoep_expert = !pgroups.empty() && pgroups[g].autoep_expert;
    sub.partition_count = pgroups.empty() ? L.dp : pgroups[g].partition_count;
    sub.partition_rank = pgroups.empty() ? d : pgroups[g].partition_rank;
    sub.states = shard.states(g);
    sub.has_step = shard.has_step(g);
    const int64_t need =
        add_zero3_subgroup(plan, index, sub, groups[g], rank_autoep, autoep_param, L.dp, L.zero3_model_files[t][d], path);
    if (need != shard.state_tensor(g, "fp32").numel())
      fail(path, "sub-group " + std::to_string(g) + " holds " + std::to_string(shard.state_tensor(g, "fp32").numel()) +
                     " elements but its parameters need " + std::to_string(need));
  }
  agreement.optim_shard(shard, root, path);
}

}  // namespace

ExtractPlan plan_zero3(const formats::deepspeed::DeepSpeedLayout& L, const ExtractOptions& options) {
  if (L.pipeline || L.pp != 1)
    throw Error(L.dir + ": ZeRO-3 with pipeline parallelism is not supported (DeepSpeed's PipelineEngine "
                        "refuses ZeRO stage 2 and 3, so such checkpoints are not written)");
  ExtractPlan plan;
  ShardAgreement agreement;
  const Zero3ModelFiles files = read_zero3_model_files(L, agreement, options.open);
  const auto& autoep_of_rank = files.autoep_of_rank;
  const std::vector<formats::deepspeed::AutoEpLayer>& autoep = autoep_of_rank[0];
  const std::map<std::string, size_t> autoep_param = check_autoep_ranks_agree(L, autoep_of_rank);
  const Zero3ModelStates model = read_zero3_param_shapes(L, files.first_of_tp);
  const patterns::PatternSet pset = choose_patterns(options, model.uc_info, L, plan);
  std::vector<std::string> tp_model_files;
  for (const auto& row : L.zero3_model_files) tp_model_files.push_back(row[0]);
  const auto index = zero3_params(plan, model.sub_groups, autoep, autoep_param, tp_model_files);
  for (int t = 0; t < L.tp; ++t)
    for (int d = 0; d < L.dp; ++d)
      add_zero3_shard(plan, index, L, t, d, model.sub_groups[t], autoep_of_rank[d], autoep_param, !autoep.empty(),
                      agreement, options.open);
  agreement.finish();
  check_zero3_coverage(plan, L.tp, L.dir);
  if (L.tp > 1) {  // the joins use the patterns: a pattern matching no parameter is reported
    std::set<std::string> used;
    for (const auto& p : plan.params)
      for (const auto& s : patterns::classify(pset, p.name).matched) used.insert(s);
    plan.unused_patterns = pset.unused_sources(used);
  }
  plan.model_files.clear();
  for (const auto& row : L.zero3_model_files)
    for (const auto& f : row) plan.model_files.push_back(f);
  plan.optimizer_state_file = L.optim_files[0][0];
  auto& s = plan.source;
  s.dir = fs::absolute(L.dir).string();
  s.tag = L.tag;
  s.tp = L.tp;
  s.pp = 1;
  s.dp = L.dp;
  s.ep = autoep.empty() ? 1 : autoep[0].ep_size;
  s.zero_stage = 3;
  s.pipeline = false;
  s.bf16 = L.bf16_prefix;
  s.sub_groups = static_cast<int64_t>(model.sub_groups[0].size());
  if (!autoep.empty()) s.autoep = formats::deepspeed::autoep_layers_json(autoep);
  return plan;
}

}  // namespace ucpkit::to_universal
