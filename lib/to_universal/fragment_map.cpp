// Fragment mapping (see fragment_map.h).
#include "to_universal/fragment_map.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "core/error.h"
#include "formats/deepspeed/moe.h"

namespace ucpkit::to_universal {

GroupPartition group_partition(const GroupInfo& group, int g, int dp_rank, int dp, bool data_before_expert,
                               const std::string& path) {
  GroupPartition gp{dp_rank, dp, -1};
  if (group.moe) {
    if (group.ep_size <= 0) fail(path, "expert param group " + std::to_string(g) + " has no ep_size_<N> name");
    auto c = formats::deepspeed::ep_coords(dp_rank, dp, group.ep_size, data_before_expert);
    gp.part = c.edp_rank;
    gp.count = dp / group.ep_size;
    gp.ep_rank = c.ep_rank;
  }
  if (group.partition_count >= 0 && group.partition_count != gp.count)
    fail(path, "inconsistent world sizes: param group " + std::to_string(g) + " has partition_count " +
                   std::to_string(group.partition_count) + ", expected " + std::to_string(gp.count));
  return gp;
}

Zero12FragmentMap::Zero12FragmentMap(int tp, int pp, const patterns::PatternSet& patterns, const ExpertFacts& experts)
    : tp_(tp), pp_(pp), patterns_(patterns), experts_(experts) {}

const patterns::ParamRule& Zero12FragmentMap::rule_of(const std::string& name) {
  auto it = rules_.find(name);
  if (it == rules_.end()) it = rules_.emplace(name, patterns::classify(patterns_, name)).first;
  return it->second;
}

// The parameter a fragment of `local` belongs to, and its place in that parameter's join order.
Zero12FragmentMap::Target Zero12FragmentMap::target_of(const std::string& local, const ShardGroup& group,
                                                       const std::string& path) const {
  const int g = group.group;
  const GroupPartition& gp = group.partition;
  Target t;
  t.name = local;
  t.part = gp.part;
  if (group.info.moe && !experts_.autoep.empty()) {
    // AutoEP: the fused [E_local, ...] weight has the same name on every EP rank; the
    // partitions of EP rank r (its expert-DP group, in rank order) hold experts
    // r*E_local .. (r+1)*E_local-1 (autoep_universal.py:301-328), so part = r * (DP/EP) + edp.
    auto it = experts_.autoep_param.find(local);
    if (it == experts_.autoep_param.end())
      fail(path, "expert param group " + std::to_string(g) + " holds " + local +
                     ", which is no AutoEP expert weight (<expert_key_prefix>.w1/w2/w3 of ds_autoep_layers)");
    t.autoep = &experts_.autoep[it->second];
    if (group.info.ep_size != t.autoep->ep_size)
      fail(path, "expert param group " + std::to_string(g) + " is ep_size_" + std::to_string(group.info.ep_size) +
                     " but ds_autoep_layers says ep_size " + std::to_string(t.autoep->ep_size));
    t.part = gp.ep_rank * gp.count + gp.part;
    t.moe_layer = t.autoep->moe_layer_id;
  } else if (group.info.moe) {
    auto j = formats::deepspeed::local_expert_index(local);
    if (!j) fail(path, "expert group holds a non-expert parameter " + local);
    if (tp_ > 1 || pp_ > 1) fail(path, "native DeepSpeed MoE with tp > 1 or pp > 1 is not supported");
    auto ml = experts_.moe_layer_of.find(formats::deepspeed::with_expert_index(local, 0));
    if (ml == experts_.moe_layer_of.end())
      fail(path, "expert parameter " + local + " is in no layer_L_expert_E_mp_rank_00_model_states.pt file");
    const auto& num_experts = experts_.num_experts;
    if (ml->second >= static_cast<int>(num_experts.size()))
      fail(path, "native MoE layer " + std::to_string(ml->second) + " but num_experts lists " +
                     std::to_string(num_experts.size()) + " layers");
    const int experts = num_experts[ml->second];
    if (experts <= 0 || experts % group.info.ep_size != 0)
      fail(path, "MoE layer " + std::to_string(ml->second) + ": num_experts " + std::to_string(experts) +
                     " is not a positive multiple of ep_size " + std::to_string(group.info.ep_size));
    const int per = experts / group.info.ep_size;
    if (*j >= per)
      fail(path, "expert parameter " + local + ": local expert index " + std::to_string(*j) + " but only " +
                     std::to_string(per) + " experts per EP rank in MoE layer " + std::to_string(ml->second));
    t.expert = gp.ep_rank * per + *j;
    // The layer comes from the expert file holding the parameter, never from its name alone.
    auto number = experts_.layer_number.find(ml->second);
    t.moe_layer = number == experts_.layer_number.end() ? ml->second : number->second;
    t.name = formats::deepspeed::with_expert_index(local, t.expert);
  }
  return t;
}

void Zero12FragmentMap::add(ExtractPlan& plan, const ShardGroup& group, const ShapeMap& shapes, const std::string& model_file,
                            const std::string& path) {
  const int tp_rank = group.tp_rank, pp_rank = group.pp_rank;
  for (const auto& [local, start, numel] : group.fragments) {
    const Target target = target_of(local, group, path);
    const std::string& name = target.name;
    const formats::deepspeed::AutoEpLayer* ae = target.autoep;
    const auto& rule = rule_of(name);
    if (pp_rank > 0 && rule.pipeline_replicated) continue;
    auto [it, fresh] = index_.emplace(name, plan.params.size());
    if (fresh) {
      ParamPlan p;
      p.name = name;
      p.tp_shapes.assign(tp_, {});
      p.fragments.assign(tp_, {});
      p.pp_stage = pp_rank;
      p.moe_layer = target.moe_layer;
      p.expert = target.expert;
      p.states = group.states;
      if (group.has_step) {
        p.step_file = group.file;
        p.step_group = group.group;
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
    const SourceFragment fragment{group.file, group.group, start, numel, target.part};
    auto sh = shapes.find(name);
    if (ae) {  // checked against num_local_experts by check_autoep_files
      if (p.tp_shapes[tp_rank].empty()) {
        p.tp_shapes[tp_rank] = sh->second;
        p.tp_shapes[tp_rank][0] = ae->num_experts;
      }
      p.fragments[tp_rank].push_back(fragment);
      continue;
    }
    if (group.info.moe && (sh == shapes.end() || !experts_.expert_file_of.count(name)))
      fail(path, "expert parameter " + name + " (global expert " + std::to_string(target.expert) +
                     ") is in none of the layer_L_expert_E_mp_rank_00_model_states.pt files");
    if (sh == shapes.end())
      fail(path, "parameter " + name + " has no shape in " + model_file + " (param_shapes/module)");
    if (p.tp_shapes[tp_rank].empty()) p.tp_shapes[tp_rank] = sh->second;
    p.fragments[tp_rank].push_back(fragment);
  }
}

std::vector<std::string> Zero12FragmentMap::unused_patterns() const {
  std::set<std::string> used;
  for (const auto& [n, r] : rules_)
    for (const auto& s : r.matched) used.insert(s);
  return patterns_.unused_sources(used);
}

namespace {

void sort_by_part(std::vector<SourceFragment>& fr) {
  std::stable_sort(fr.begin(), fr.end(), [](const SourceFragment& a, const SourceFragment& b) { return a.part < b.part; });
}

int64_t numel_in(const std::vector<SourceFragment>& fr) {
  int64_t have = 0;
  for (const auto& f : fr) have += f.numel;
  return have;
}

}  // namespace

void check_zero12_coverage(ExtractPlan& plan, int tp, const std::string& dir) {
  for (auto& p : plan.params) {
    for (int t = 0; t < tp; ++t) {
      auto& fr = p.fragments[t];
      sort_by_part(fr);
      for (size_t i = 1; i < fr.size(); ++i)
        if (fr[i].part == fr[i - 1].part)
          throw Error(plan.files[fr[i].file] + ": parameter " + p.name + " appears twice in partition " +
                      std::to_string(fr[i].part) + " (extra shard?)");
      const int64_t have = numel_in(fr);
      if (fr.empty())
        throw Error(dir + ": parameter " + p.name + " has no fragments for tp rank " + std::to_string(t) +
                    " (missing shard?)");
      if (have != numel_of(p.tp_shapes[t]))
        throw Error(dir + ": parameter " + p.name + " tp rank " + std::to_string(t) + ": fragments hold " +
                    std::to_string(have) + " elements but its shape " + shape_str(p.tp_shapes[t]) + " needs " +
                    std::to_string(numel_of(p.tp_shapes[t])) + " (missing or extra shard?)");
    }
  }
}

std::map<std::string, size_t> zero3_params(ExtractPlan& plan, const std::vector<SubGroups>& sub_groups,
                                           const std::vector<formats::deepspeed::AutoEpLayer>& autoep,
                                           const std::map<std::string, size_t>& autoep_param,
                                           const std::vector<std::string>& model_files) {
  const int tp = static_cast<int>(sub_groups.size());
  // Parameters in TP rank 0's param_shapes order; every TP rank must list the same names.
  std::map<std::string, size_t> index;
  for (const auto& row : sub_groups[0])
    for (const auto& [name, shape] : row) {
      if (!index.emplace(name, plan.params.size()).second)
        fail(model_files[0], "parameter " + name + " listed twice in param_shapes");
      ParamPlan p;
      p.name = name;
      p.tp_shapes.assign(tp, {});
      p.fragments.assign(tp, {});
      if (auto a = autoep_param.find(name); a != autoep_param.end()) {
        p.autoep_experts = autoep[a->second].num_experts;
        p.moe_layer = autoep[a->second].moe_layer_id;
      }
      plan.params.push_back(std::move(p));
    }
  for (const auto& [name, layer] : autoep_param)  // engine.py:5103-5111 checks the same when saving
    if (!index.count(name)) fail(model_files[0], "AutoEP expert weight " + name + " is not in param_shapes");
  for (int t = 0; t < tp; ++t) {
    size_t listed = 0;
    for (const auto& row : sub_groups[t])
      for (const auto& [name, shape] : row) {
        auto it = index.find(name);
        if (it == index.end()) fail(model_files[t], "parameter " + name + " is not in tp rank 0's param_shapes");
        ParamPlan& p = plan.params[it->second];
        p.tp_shapes[t] = shape;
        if (p.autoep_experts > 0) {  // [E_local, ...] on every rank (ds_shape); the universal form is [E, ...]
          const auto& a = autoep[autoep_param.at(name)];
          if (shape.empty() || shape[0] != a.num_local_experts)
            fail(model_files[t], "AutoEP expert weight " + name + " has shape " + shape_str(shape) +
                                     " but ds_autoep_layers says " + std::to_string(a.num_local_experts) +
                                     " local experts");
          p.tp_shapes[t][0] = a.num_experts;
        }
        ++listed;
      }
    if (listed != plan.params.size())
      fail(model_files[t], "param_shapes lists " + std::to_string(listed) + " parameters but tp rank 0's lists " +
                               std::to_string(plan.params.size()));
  }
  return index;
}

int64_t add_zero3_subgroup(ExtractPlan& plan, const std::map<std::string, size_t>& index, const Zero3SubGroup& sub,
                        const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                        const std::vector<formats::deepspeed::AutoEpLayer>& rank_autoep,
                        const std::map<std::string, size_t>& autoep_param, int dp, const std::string& model_file,
                        const std::string& path) {
  const int g = sub.group, d = sub.dp_rank, count = sub.partition_count, prank = sub.partition_rank;
  const bool expert_group = sub.autoep_expert;
  if (!expert_group && (count != dp || prank != d))
    fail(path, "sub-group " + std::to_string(g) + " is partition " + std::to_string(prank) + " of " +
                   std::to_string(count) + " but dense sub-groups are partitioned over all " + std::to_string(dp) +
                   " DP ranks (this is DP rank " + std::to_string(d) + ")");
  int64_t offset = 0;
  for (const auto& [name, shape] : params) {
    ParamPlan& p = plan.params[index.at(name)];
    if ((p.autoep_experts > 0) != expert_group)
      fail(path, "sub-group " + std::to_string(g) +
                     (expert_group ? " is an AutoEP expert sub-group but holds "
                                   : " is a dense sub-group but holds AutoEP expert weight ") +
                     name);
    int part = d;  // the slice's place in its parameter's join order
    const int64_t n = numel_of(shape);  // expert weights: this EP rank's [E_local, ...]
    if (expert_group) {
      // This rank's fused [E_local, ...] weight of EP rank r, partition prank of the expert-DP
      // group: the parameter's slices in part order r*(DP/EP) + prank give [E, ...]
      // (ds_to_universal.py:654-707 joins the same way).
      const auto& a = rank_autoep[autoep_param.at(name)];
      if (count != a.expert_data_parallel_world_size || prank != a.expert_data_parallel_rank)
        fail(path, "sub-group " + std::to_string(g) + " is partition " + std::to_string(prank) + " of " +
                       std::to_string(count) + " but " + model_file + " records expert-DP rank " +
                       std::to_string(a.expert_data_parallel_rank) + " of " +
                       std::to_string(a.expert_data_parallel_world_size));
      part = a.ep_rank * count + prank;
    }
    const int64_t per = (n + count - 1) / count;
    const int64_t have = std::max<int64_t>(0, std::min(per, n - prank * per));
    if (sub.tp_rank == 0 && d == 0) {
      p.states = sub.states;
      if (sub.has_step) {
        p.step_file = sub.file;
        p.step_group = g;
      }
    } else if (sub.states != p.states) {
      fail(path, "parameter " + name + ": sub-group " + std::to_string(g) +
                     " holds other optimizer states than tp rank 0, dp rank 0");
    }
    if (have > 0) p.fragments[sub.tp_rank].push_back({sub.file, g, offset, have, part});
    offset += per;
  }
  return offset;
}

void check_zero3_coverage(ExtractPlan& plan, int tp, const std::string& dir) {
  for (auto& p : plan.params)
    for (int t = 0; t < tp; ++t) {
      auto& fr = p.fragments[t];
      sort_by_part(fr);
      for (size_t i = 1; i < fr.size(); ++i)
        if (fr[i].part == fr[i - 1].part)
          throw Error(plan.files[fr[i].file] + ": parameter " + p.name + " partition " + std::to_string(fr[i].part) +
                      " is also in " + plan.files[fr[i - 1].file] +
                      " (two ranks claim the same EP rank and expert-DP rank)");
      const int64_t have = numel_in(fr);
      if (have != numel_of(p.tp_shapes[t]))
        throw Error(dir + ": parameter " + p.name + (tp > 1 ? " tp rank " + std::to_string(t) : std::string()) +
                    ": ZeRO-3 slices hold " + std::to_string(have) + " of " + std::to_string(numel_of(p.tp_shapes[t])) +
                    " elements");
    }
}

}  // namespace ucpkit::to_universal
