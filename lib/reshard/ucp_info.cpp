// UcpInfo: target-rank slices, flat-buffer layout and ZeRO partitions, computed without I/O.
#include "reshard/ucp_info.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"
#include "io/shape.h"
#include "formats/deepspeed/moe.h"
#include "formats/deepspeed/partition.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/zero_partition.h"
#include "formats/universal/join.h"

namespace ucpkit::reshard {

nlohmann::json TargetLayout::to_json() const {
  nlohmann::json j = {{"tp", tp},
          {"pp", pp},
          {"dp", dp},
          {"zero_stage", zero_stage},
          {"ep", ep},
          {"dtype", std::string(dtype_name(dtype))},
          {"bf16_optimizer", bf16_optimizer}};
  if (zero_stage == 3) j["sub_group_size"] = sub_group_size;
  if (!ds_line.empty()) j["ds_line"] = ds_line;
  if (!partition_method.empty()) j["partition_method"] = partition_method;
  if (!layer_types.empty()) j["layer_types"] = layer_types;
  return j;
}

int64_t TpSlice::numel() const { return numel_of(shape); }

TpSlice tp_slice(const std::string& name, const std::vector<int64_t>& shape, const patterns::ParamRule& rule,
                 const patterns::PatternSet& set, int tp, int t, int64_t padded_rows) {
  TpSlice s;
  s.shape = shape;
  if (padded_rows >= 0) {
    if (shape.empty() || padded_rows < shape[0])
      throw Error("vocabulary parameter " + name + " has more rows than the padded vocabulary (" +
                  std::to_string(padded_rows) + ")");
    s.padded_rows = padded_rows;
    s.shape[0] = padded_rows;
  }
  const std::vector<int64_t> full = s.shape;
  if (full.empty()) {  // a scalar: replicated
    s.dim = 0;
    return s;
  }
  const auto cut = formats::universal::split(name, full, rule, set, tp, t);  // the join table's split
  s.dim = cut.dim;
  s.pieces = cut.pieces;
  s.shape = cut.shape;
  return s;
}

namespace {
// The flat buffer of `g` as DeepSpeed partitions it, and its parameters' sizes in buffer order.
formats::deepspeed::FlatPartitioning flat_of(const GroupPlan& g) {
  return {g.numel, g.padded, g.partition, g.partition_count, g.per_param};
}
std::vector<int64_t> slot_numels(const std::vector<Slot>& slots) {
  std::vector<int64_t> n;
  n.reserve(slots.size());
  for (const auto& s : slots) n.push_back(s.numel());
  return n;
}
void set_partitioning(GroupPlan& g, const formats::deepspeed::FlatPartitioning& p) {
  g.numel = p.numel;
  g.padded = p.padded;
  g.partition = p.partition;
  g.partition_count = p.count;
  g.per_param = p.per_param;
}
}  // namespace

PartitionPlan partition_of(const GroupPlan& g, int part) {
  PartitionPlan p;
  p.part = part;
  auto c = formats::deepspeed::partition_runs(flat_of(g), slot_numels(g.slots), part);
  p.padding = c.padding;
  p.fragments.reserve(c.runs.size());
  for (const auto& r : c.runs) p.fragments.push_back({static_cast<int>(r.param), r.start, r.numel, r.param_offset});
  return p;
}

std::string MpRankPlan::model_file() const { return formats::deepspeed::model_states_name(mp); }

std::string UcpInfo::optim_file(int dp_rank, int mp) const {
  return formats::deepspeed::optim_states_name(dp_rank, mp, target.dtype == DType::BFloat16);
}

std::string UcpInfo::zero3_model_file(int dp_rank, int mp) const { return formats::deepspeed::zero3_model_states_name(dp_rank, mp); }

formats::deepspeed::TargetFiles UcpInfo::files(bool native_moe) const {
  formats::deepspeed::TargetFiles f;
  f.tp = target.tp;
  f.pp = target.pp;
  f.dp = target.dp;
  f.ep = target.ep;
  f.zero3 = target.zero_stage == 3;
  f.bf16 = target.dtype == DType::BFloat16;  // optim_file's prefix
  f.native_moe = native_moe;
  f.layer_model_axis = layer_model_axis;
  for (const auto& mr : mp_ranks) {
    auto& r = f.mp_ranks.emplace_back();
    for (const auto& lf : mr.layers) r.layers.push_back(lf.layer);
    for (const auto& ef : mr.expert_files) r.experts.emplace_back(ef.moe_id, ef.expert);
  }
  return f;
}

int UcpInfo::global_rank(int pp_rank, int dp_rank, int tp_rank) const {
  return (pp_rank * target.dp + dp_rank) * target.tp + tp_rank;
}

bool megatron_blocks(const ModelInfo& m) {
  return std::any_of(m.params.begin(), m.params.end(), [](const ParamInfo& p) { return p.transformer; });
}

std::map<int, int> partitioned_layer_stages(const ModelInfo& m, const TargetLayout& t, const std::string& method_text,
                                            int64_t padded_vocab) {
  const auto method = formats::deepspeed::parse_partition_method(method_text);
  int num_layers = m.tied_head_layer + 1;
  for (const auto& p : m.params) num_layers = std::max(num_layers, p.layer + 1);
  if (!t.layer_types.empty() && static_cast<int>(t.layer_types.size()) < num_layers)
    throw Error(t.layer_types_file + ": names " + std::to_string(t.layer_types.size()) +
                " layers, but the checkpoint has layer files up to layer " + std::to_string(num_layers - 1) +
                " (--layer-types names every entry of the PipelineModule's layer list, in order)");
  num_layers = std::max(num_layers, static_cast<int>(t.layer_types.size()));
  std::vector<formats::deepspeed::PipelineLayer> layers(static_cast<size_t>(std::max(num_layers, 0)));
  for (size_t i = 0; i < t.layer_types.size(); ++i) layers[i].type_name = t.layer_types[i];
  std::set<int> with_params;
  for (const auto& p : m.params) {
    if (p.layer < 0) continue;
    const int64_t n = tp_slice(p.name, p.shape, p.rule, m.patterns, t.tp, 0, p.rule.vocab ? padded_vocab : -1).numel();
    layers[p.layer].params += n;
    with_params.insert(p.layer);
    if (p.tied && p.rule.pipeline_replicated && m.tied_head_layer >= 0) {
      layers[m.tied_head_layer].params += n;
      with_params.insert(m.tied_head_layer);
    }
  }
  std::vector<int64_t> parts;
  try {
    parts = formats::deepspeed::partition_layers(method, layers, t.pp);
  } catch (const Error& e) {  // type:<regex> without class names; a Megatron model has its own rule
    if (method.kind != formats::deepspeed::PartitionMethod::Kind::Type || !megatron_blocks(m)) throw;
    throw Error(std::string(e.what()) + " (without --partition-method this Megatron model's transformer blocks are "
                "split evenly over the stages, as Megatron-DeepSpeed's type:transformer does)");
  }
  std::map<int, int> layer_stage;
  for (int s = 0; s < t.pp; ++s) {
    bool any = false;
    for (int64_t L = parts[s]; L < parts[s + 1]; ++L)
      if (with_params.count(static_cast<int>(L))) layer_stage[static_cast<int>(L)] = s, any = true;
    if (!any)
      throw Error("impossible layout: --partition-method " + formats::deepspeed::to_string(method) + " over --pp " +
                  std::to_string(t.pp) + " gives stage " + std::to_string(s) + " layers [" + std::to_string(parts[s]) +
                  ", " + std::to_string(parts[s + 1]) + ") of the PipelineModule's " + std::to_string(layers.size()) +
                  ", none holding parameters (give fewer stages or another --partition-method)");
  }
  return layer_stage;
}

std::vector<int> stage_of_blocks(int n, int pp) {
  std::vector<int> out;
  const int base = n / pp, extra = n % pp;
  for (int s = 0; s < pp; ++s)
    for (int k = 0; k < base + (s < extra ? 1 : 0); ++k) out.push_back(s);
  return out;
}

namespace {

void check_layout(const ModelInfo& m, const TargetLayout& t) {
  auto pos = [](int v, const char* what) {
    if (v < 1) throw UsageError(std::string("--") + what + " must be at least 1");
  };
  pos(t.tp, "tp");
  pos(t.pp, "pp");
  pos(t.dp, "dp");
  pos(t.ep, "ep");
  // The plan holds a few kB per target rank (and the output a file or more per rank): a world size no
  // cluster has (a typo, 1e6 for 1e3) is refused before it takes gigabytes.
  const int64_t world = static_cast<int64_t>(t.tp) * t.pp * t.dp;
  if (world > kMaxTargetWorldSize)
    throw UsageError("target world size tp*pp*dp = " + std::to_string(world) + " is larger than " +
                     std::to_string(kMaxTargetWorldSize) + " ranks");
  if (t.zero_stage < 0 || t.zero_stage > 3) throw UsageError("--zero-stage must be 0, 1, 2 or 3");
  if (t.pp > 1 && t.zero_stage > 1)
    throw UsageError("pipeline parallelism (--pp " + std::to_string(t.pp) + ") needs ZeRO stage 0 or 1, not " +
                     std::to_string(t.zero_stage));
  if (t.bf16_optimizer && t.dtype != DType::BFloat16) throw UsageError("the BF16 optimizer needs --dtype bf16");
  if (t.bf16_optimizer && t.zero_stage > 1) throw UsageError("the BF16 optimizer runs with ZeRO stage 0 or 1 only");
  if (t.zero_stage == 0 && !t.bf16_optimizer)
    throw UsageError("ZeRO stage 0 is written as BF16_Optimizer shards: it needs --dtype bf16");
  if (t.zero_stage == 3) {
    if (t.sub_group_size < 1) throw UsageError("--sub-group-size must be at least 1");
    if (m.pipeline)
      throw Error("impossible layout: ZeRO-3 with a PipelineModule checkpoint (layer files): DeepSpeed's "
                  "PipelineEngine runs ZeRO stage 0 or 1 only");
    if (m.native_moe) throw Error("ZeRO-3 targets for native DeepSpeed MoE are not supported (stages 0-2 are)");
  }
  if (m.autoep) {
    if (t.tp != 1 || t.pp != 1 || t.zero_stage == 0)
      throw Error("DeepSpeed AutoEP targets are written with TP = PP = 1 and ZeRO stage 1, 2 or 3 only (asked tp=" +
                  std::to_string(t.tp) + ", pp=" + std::to_string(t.pp) + ", zero=" + std::to_string(t.zero_stage) + ")");
    for (const auto& p : m.params)
      if (p.autoep_experts > 0 && p.autoep_experts % t.ep)
        throw Error("impossible layout: --ep " + std::to_string(t.ep) + " does not divide the " +
                    std::to_string(p.autoep_experts) + " experts of " + p.name);
    if (t.dp % t.ep)
      throw UsageError("--ep " + std::to_string(t.ep) + " must divide --dp " + std::to_string(t.dp) +
                       " (expert-data-parallel groups)");
  }
  if (t.ep > 1 && !m.native_moe && !m.autoep)
    throw UsageError("--ep " + std::to_string(t.ep) + " but the model has no native MoE experts");
  if (m.native_moe) {
    if (t.tp != 1 || t.pp != 1)
      throw Error("native DeepSpeed MoE targets are written with TP = PP = 1 only (asked tp=" + std::to_string(t.tp) +
                  ", pp=" + std::to_string(t.pp) + ")");
    for (int e : m.num_experts)
      if (e % t.ep)
        throw Error("impossible layout: --ep " + std::to_string(t.ep) + " does not divide the " + std::to_string(e) +
                    " experts of a MoE layer");
    if (t.dp % t.ep)
      throw UsageError("--ep " + std::to_string(t.ep) + " must divide --dp " + std::to_string(t.dp) +
                       " (expert-data-parallel groups)");
  }
  if (t.pp > 1 && !m.pipeline)
    throw Error("impossible layout: the universal checkpoint holds a non-pipeline model (language_model.* names); "
                "--pp " + std::to_string(t.pp) + " needs a PipelineModule checkpoint");
  auto divides = [&](int64_t size, const char* what) {
    if (size > 0 && size % t.tp)
      throw Error("impossible layout: tp=" + std::to_string(t.tp) + " does not divide " + what + " (" +
                  std::to_string(size) + ")");
  };
  divides(m.heads, "the number of attention heads");
  divides(m.kv_heads, "the number of key/value heads");
  divides(m.ffn, "the FFN hidden size");
}

// The slots of parameter group `g` in flat-buffer order, offsets set, handed to `close` as one group
// (ZeRO-1/2) or as the ZeRO-3 sub-groups stage3.py's _create_fp16_sub_groups cuts (zero_partition.h).
// Returns per slot its (sub-group index from the first, slot index in that sub-group).
template <typename Close>
std::vector<std::pair<int, int>> cut_group(int g, std::vector<Slot> slots, bool zero3, int count,
                                           int64_t sub_group_size, Close close) {
  std::vector<std::pair<size_t, size_t>> ranges{{0, slots.size()}};
  if (zero3) ranges = formats::deepspeed::zero3_sub_groups(slot_numels(slots), count, sub_group_size);
  std::vector<std::pair<int, int>> at(slots.size());
  for (size_t r = 0; r < ranges.size(); ++r) {
    GroupPlan gp;
    gp.group = g;
    gp.per_param = zero3;
    for (size_t k = ranges[r].first; k < ranges[r].second; ++k) {
      slots[k].offset = gp.numel;
      gp.numel += slots[k].numel();
      at[k] = {static_cast<int>(r), static_cast<int>(gp.slots.size())};
      gp.slots.push_back(std::move(slots[k]));
    }
    close(std::move(gp));
  }
  return at;
}

// An expert group (its numel set) partitioned over the expert-DP group (zero_partition.h):
// ZeRO-1/2 pad it to 2 * edp and split it equally; a ZeRO-3 sub-group (`per_param`) splits every
// parameter on its own into ceil(numel / edp) slices.
void close_expert_group(GroupPlan gp, int edp, std::vector<GroupPlan>& out) {
  if (gp.per_param) set_partitioning(gp, formats::deepspeed::zero3_partitioning(slot_numels(gp.slots), edp));
  else set_partitioning(gp, formats::deepspeed::zero12_partitioning(gp.numel, edp));
  out.push_back(std::move(gp));
}

void sort_expert_files(MpRankPlan& mr) {
  std::sort(mr.expert_files.begin(), mr.expert_files.end(), [](const ExpertFilePlan& a, const ExpertFilePlan& b) {
    return std::make_pair(a.moe_id, a.expert) < std::make_pair(b.moe_id, b.expert);
  });
}

// The expert file of (MoE layer, global expert) in `mr`, made on first use (file_of: its index).
auto& expert_file_for(MpRankPlan& mr, std::map<std::pair<int, int>, size_t>& file_of, int moe_id, int expert) {
  auto [it, fresh] = file_of.try_emplace({moe_id, expert}, mr.expert_files.size());
  if (fresh) mr.expert_files.push_back({moe_id, expert, {}, {}});
  return mr.expert_files[it->second];
}

// Expert param groups of every EP rank: its experts (global id / per == rank) under local names,
// padded to 2 * (DP/EP) and partitioned over the expert-data-parallel group; and the expert files.
void add_expert_groups(const ModelInfo& m, const UcpInfo& info, MpRankPlan& mr) {
  const auto& t = info.target;
  const int edp = t.dp / t.ep;
  std::map<std::pair<int, int>, size_t> file_of;
  mr.expert_groups.assign(t.ep, {});
  for (int r = 0; r < t.ep; ++r) {
    for (int g : m.expert_group_of) {
      if (g < 0) continue;
      GroupPlan gp;
      gp.group = g;
      int64_t off = 0;
      for (size_t i = 0; i < m.params.size(); ++i) {
        const auto& p = m.params[i];
        if (p.expert < 0 || p.group != g) continue;
        const int per = m.num_experts.at(std::max(0, p.moe_id)) / t.ep;
        if (p.expert / per != r) continue;
        Slot slot;
        slot.param = static_cast<int>(i);
        slot.name = formats::deepspeed::with_expert_index(p.name, p.expert % per);
        slot.slice = tp_slice(p.name, p.shape, p.rule, m.patterns, 1, 0, -1);
        slot.offset = off;
        off += slot.numel();
        expert_file_for(mr, file_of, p.moe_id, p.expert).entries.push_back(
            {p.name, {r, static_cast<int>(mr.expert_groups[r].size()), static_cast<int>(gp.slots.size()), -1}});
        gp.slots.push_back(std::move(slot));
      }
      gp.numel = off;
      if (!gp.slots.empty()) close_expert_group(std::move(gp), edp, mr.expert_groups[r]);
    }
  }
  sort_expert_files(mr);
}

// AutoEP (docs/formats.md "AutoEP"): per EP rank r one expert group of the fused weights under their
// own names, each slot rows r*E_local .. of the [E, ...] tensor, partitioned over the expert-data-parallel
// group. ZeRO-1/2: padded to 2 * (DP/EP), and per (layer, global expert) one file of that expert's rows.
// ZeRO-3 ("AutoEP under ZeRO-3"): per-parameter partitions, cut into sub-groups at sub_group_size as
// stage3.py _create_fp16_sub_groups does (:833-880), and no expert files (engine.py:5025-5027).
void add_autoep_groups(const ModelInfo& m, const UcpInfo& info, MpRankPlan& mr) {
  const auto& t = info.target;
  const int edp = t.dp / t.ep;
  const bool zero3 = t.zero_stage == 3;
  std::map<std::pair<int, int>, size_t> file_of;
  mr.expert_groups.assign(t.ep, {});
  for (int r = 0; r < t.ep; ++r) {
    for (int g : m.expert_group_of) {
      std::vector<Slot> slots;
      for (size_t i = 0; i < m.params.size(); ++i) {
        const auto& p = m.params[i];
        if (p.autoep_experts <= 0 || p.group != g) continue;
        const int per = p.autoep_experts / t.ep;
        Slot slot;
        slot.param = static_cast<int>(i);
        slot.name = p.name;
        slot.slice.dim = 0;
        slot.slice.pieces = {{static_cast<int64_t>(r) * per, per}};
        slot.slice.shape = p.shape;
        slot.slice.shape[0] = per;
        for (int j = 0; j < per && !zero3; ++j) {  // ZeRO-1/2: one group, the slot's index is its place in it
          auto& ef = expert_file_for(mr, file_of, p.moe_id, r * per + j);
          Slot row = slot;
          row.slice.pieces = {{static_cast<int64_t>(r) * per + j, 1}};
          row.slice.shape[0] = 1;
          ef.entries.push_back({p.name + "." + std::to_string(r * per + j),
                                {r, static_cast<int>(mr.expert_groups[r].size()), static_cast<int>(slots.size()),
                                 static_cast<int>(ef.rows.size())}});
          ef.rows.push_back(std::move(row));
        }
        slots.push_back(std::move(slot));
      }
      if (slots.empty()) continue;
      cut_group(g, std::move(slots), zero3, edp, t.sub_group_size,
                [&](GroupPlan gp) { close_expert_group(std::move(gp), edp, mr.expert_groups[r]); });
    }
  }
  sort_expert_files(mr);
}

}  // namespace

std::pair<int, int> UcpInfo::ep_coords(int d) const {
  const auto c = formats::deepspeed::ep_coords(d, target.dp, target.ep, data_before_expert);
  return {c.ep_rank, c.edp_rank};
}

namespace {

// The pipeline stage(s) of every parameter (a set: tied embeddings live on the first and the last
// stage) and the layers of every stage. A non-pipeline model is one stage without layer files.
struct StageAssignment {
  std::vector<std::vector<int>> param_stages;  // [param] the stages holding it
  std::vector<std::vector<int>> stage_layers;  // [stage] its pipeline layers (UcpInfo::stage_layers)
};

// Megatron's rule: the transformer blocks evenly over the stages (stage_of_blocks), layers before
// the first block on stage 0, the others on the last stage.
std::map<int, int> megatron_layer_stages(const ModelInfo& m, int P) {
  std::set<int> blocks_set, layers_set;
  for (const auto& p : m.params) {
    if (p.layer >= 0) layers_set.insert(p.layer);
    if (p.transformer) blocks_set.insert(p.layer);
  }
  std::vector<int> blocks(blocks_set.begin(), blocks_set.end());
  if ((int)blocks.size() < P)
    throw Error("impossible layout: --pp " + std::to_string(P) + " but the model has only " +
                std::to_string(blocks.size()) + " transformer layers");
  const auto st = stage_of_blocks(static_cast<int>(blocks.size()), P);
  std::map<int, int> layer_stage;
  for (size_t i = 0; i < blocks.size(); ++i) layer_stage[blocks[i]] = st[i];
  const int first_block = blocks.front();
  for (int L : layers_set)
    if (!layer_stage.count(L)) layer_stage[L] = L < first_block ? 0 : P - 1;
  std::set<int> tied_layers;
  for (const auto& p : m.params)
    if (p.tied) {
      tied_layers.insert(p.layer);
      if (p.rule.pipeline_replicated && m.tied_head_layer >= 0) tied_layers.insert(m.tied_head_layer);
    }
  for (int L : tied_layers)
    if (!layer_stage.count(L)) layer_stage[L] = L < first_block ? 0 : P - 1;
  return layer_stage;
}

StageAssignment assign_stages(const ModelInfo& m, const TargetLayout& t, int64_t padded_vocab) {
  const int P = t.pp;
  StageAssignment a;
  a.param_stages.resize(m.params.size());
  a.stage_layers.assign(P, {});
  if (!m.pipeline) {
    for (auto& s : a.param_stages) s = {0};
    return a;
  }
  const bool megatron_rule = t.partition_method.empty() && megatron_blocks(m);
  const std::map<int, int> layer_stage =
      megatron_rule ? megatron_layer_stages(m, P)
                    : partitioned_layer_stages(m, t, t.partition_method.empty() ? kDefaultPartitionMethod : t.partition_method,
                                               padded_vocab);
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    if (p.tied) {
      a.param_stages[i].push_back(0);
      if (p.rule.pipeline_replicated && P > 1) a.param_stages[i].push_back(P - 1);
    } else {
      a.param_stages[i].push_back(layer_stage.at(p.layer));
    }
  }
  for (const auto& [L, s] : layer_stage) a.stage_layers[s].push_back(L);
  return a;
}

// The dense (non-expert) parameters of param group `g` on stage `s`, in flat-buffer order: a tied
// parameter's copy on a later stage goes before or after the stage's own ones, as in the source.
std::vector<int> group_order(const ModelInfo& m, const std::vector<std::vector<int>>& param_stages, int g, int s) {
  std::vector<int> own, tied_copies;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    if (p.group != g || p.expert >= 0 || p.autoep_experts > 0 ||
        std::find(param_stages[i].begin(), param_stages[i].end(), s) == param_stages[i].end())
      continue;
    if (p.tied && s != 0) tied_copies.push_back(static_cast<int>(i));
    else own.push_back(static_cast<int>(i));
  }
  std::vector<int> order;
  if (m.tied_copy_first) order.insert(order.end(), tied_copies.begin(), tied_copies.end());
  order.insert(order.end(), own.begin(), own.end());
  if (!m.tied_copy_first) order.insert(order.end(), tied_copies.begin(), tied_copies.end());
  return order;
}

// A dense group partitioned over `dp` ranks (zero_partition.h): ZeRO-1/2 pad the flat buffer to a
// multiple of 2 * dp and split it equally; ZeRO-3 (`per_param`) splits every parameter on its own
// into ceil(numel / dp) slices.
void close_dense_group(GroupPlan gp, int64_t dp, std::vector<GroupPlan>& out) {
  const int count = static_cast<int>(dp);
  if (gp.per_param) {
    set_partitioning(gp, formats::deepspeed::zero3_partitioning(slot_numels(gp.slots), count));
  } else {
    // A group of zero-element parameters only (no model has one) keeps one alignment unit, as
    // ucp-load has always written it; DeepSpeed's align_dense_tensors would leave it empty.
    auto p = formats::deepspeed::zero12_partitioning(std::max<int64_t>(gp.numel, 1), count);
    p.numel = gp.numel;
    set_partitioning(gp, p);
  }
  out.push_back(std::move(gp));
}

// Where a parameter sits on one model-parallel rank: param index -> (group, slot) in MpRankPlan::groups.
using SlotIndex = std::map<int, std::pair<int, int>>;

// The dense param groups of `mr` (its stage and TP rank): every group's parameters flattened in
// group_order, empty groups dropped as DeepSpeed does, ZeRO-3 groups cut into sub-groups once their
// per-rank slices reach sub_group_size. Returns where every parameter landed.
SlotIndex add_dense_groups(const ModelInfo& m, const UcpInfo& info, const std::vector<std::vector<int>>& param_stages,
                           MpRankPlan& mr) {
  const auto& target = info.target;
  const int64_t dp = target.dp;
  SlotIndex where;
  for (int g = 0; g < m.groups; ++g) {
    const auto order = group_order(m, param_stages, g, mr.pp_rank);
    if (order.empty()) continue;
    std::vector<Slot> slots;
    for (const int i : order) {
      const auto& p = m.params[i];
      Slot slot;
      slot.param = i;
      slot.name = p.name;
      slot.slice = tp_slice(p.name, p.shape, p.rule, m.patterns, target.tp, mr.tp_rank,
                            p.rule.vocab ? info.padded_vocab : -1);
      slots.push_back(std::move(slot));
    }
    const int first = static_cast<int>(mr.groups.size());
    const auto at = cut_group(g, std::move(slots), target.zero_stage == 3, static_cast<int>(dp), target.sub_group_size,
                              [&](GroupPlan gp) { close_dense_group(std::move(gp), dp, mr.groups); });
    for (size_t k = 0; k < order.size(); ++k) where[order[k]] = {first + at[k].first, at[k].second};
  }
  return where;
}

// Pipeline models: the layer files of `mr`'s stage, each listing its parameters (the tied head's
// copy included) in module (registration) order, as the source's file of that layer lists its keys.
void add_layer_files(const ModelInfo& m, const UcpInfo& info, const SlotIndex& where, MpRankPlan& mr) {
  for (int L : info.stage_layers[mr.pp_rank]) {
    LayerFilePlan lf;
    lf.layer = L;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const auto& p = m.params[i];
      auto it = where.find(static_cast<int>(i));
      if (it == where.end()) continue;
      const bool here = p.layer == L || (p.tied && p.rule.pipeline_replicated && L == m.tied_head_layer);
      if (here) lf.entries.push_back({p.local, it->second});
    }
    if (auto k = m.layer_keys.find(L); k != m.layer_keys.end()) {
      auto rank = [&](const std::string& local) {
        return std::find(k->second.begin(), k->second.end(), local) - k->second.begin();
      };
      std::stable_sort(lf.entries.begin(), lf.entries.end(),
                       [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
    }
    if (!lf.entries.empty()) mr.layers.push_back(std::move(lf));
  }
}

}  // namespace

UcpInfo ucp_info(const ModelInfo& m, const TargetLayout& target) {
  check_layout(m, target);
  UcpInfo info;
  info.target = target;
  info.data_before_expert = m.data_before_expert;
  info.layer_model_axis = m.layer_model_axis || target.tp > 1;
  info.padded_vocab = m.original_vocab > 0 ? pad_vocab(m.original_vocab, m.vocab_multiple, target.tp) : 0;
  const int P = target.pp;
  auto stages = assign_stages(m, target, info.padded_vocab);
  info.stage_layers = std::move(stages.stage_layers);
  for (int s = 0; s < P; ++s) {
    for (int t = 0; t < target.tp; ++t) {
      MpRankPlan mr;
      mr.mp = s * target.tp + t;
      mr.pp_rank = s;
      mr.tp_rank = t;
      // Carried-over state from the same coordinate when the source had it, else the nearest one
      // (the last stage from the source's last stage: it holds the head's scheduler state alike).
      const int ss = (s == P - 1) ? m.source_pp - 1 : std::min(s, m.source_pp - 1);
      mr.template_file = ss * m.source_tp + std::min(t, m.source_tp - 1);
      const SlotIndex where = add_dense_groups(m, info, stages.param_stages, mr);
      for (size_t i = 0; i < m.params.size(); ++i)
        if (auto it = where.find(static_cast<int>(i)); it != where.end()) mr.module.push_back(it->second);
      if (m.native_moe) add_expert_groups(m, info, mr);
      if (m.autoep) add_autoep_groups(m, info, mr);
      if (m.pipeline) add_layer_files(m, info, where, mr);
      info.mp_ranks.push_back(std::move(mr));
    }
  }
  return info;
}

nlohmann::json UcpInfo::to_json(const ModelInfo& m) const {
  nlohmann::json j;
  j["target"] = target.to_json();
  j["padded_vocab_size"] = padded_vocab;
  j["original_vocab_size"] = m.original_vocab;
  j["stage_layers"] = stage_layers;
  auto& mps = j["mp_ranks"] = nlohmann::json::array();
  for (const auto& mr : mp_ranks) {
    nlohmann::json x = {{"mp_rank", mr.mp},
                        {"pp_rank", mr.pp_rank},
                        {"tp_rank", mr.tp_rank},
                        {"model_file", target.zero_stage == 3 ? nlohmann::json() : nlohmann::json(mr.model_file())},
                        {"template_file", m.model_files.empty() ? "" : m.model_files.at(mr.template_file)}};
    auto& groups = x["groups"] = nlohmann::json::array();
    for (const auto& g : mr.groups) {
      nlohmann::json gj = {{"group", g.group},
                           {"numel", g.numel},
                           {"padded_numel", g.padded},
                           {"partition_numel", g.partition},
                           {"partition_count", g.partition_count}};
      if (g.per_param) gj["zero3_sub_group"] = true;
      auto& params = gj["params"] = nlohmann::json::array();
      for (const auto& s : g.slots) {
        nlohmann::json pieces = nlohmann::json::array();
        for (const auto& [a, n] : s.slice.pieces) pieces.push_back({a, n});
        nlohmann::json pj = {{"name", m.params[s.param].name},
                             {"universal_shape", m.params[s.param].shape},
                             {"shape", s.slice.shape},
                             {"slice", {{"dim", s.slice.dim}, {"pieces", pieces}}},
                             {"flat_offset", s.offset},
                             {"numel", s.numel()}};
        if (s.slice.padded_rows >= 0) pj["slice"]["padded_rows"] = s.slice.padded_rows;
        params.push_back(pj);
      }
      groups.push_back(gj);
    }
    if (!mr.layers.empty()) {
      auto& layers = x["layer_files"] = nlohmann::json::array();
      for (const auto& lf : mr.layers) {
        const std::string buf = formats::deepspeed::layer_states_name(lf.layer, mr.tp_rank, layer_model_axis);
        nlohmann::json names = nlohmann::json::array();
        for (const auto& e : lf.entries) names.push_back(e.first);
        layers.push_back({{"file", buf}, {"layer", lf.layer}, {"params", names}});
      }
    }
    if (!mr.expert_files.empty()) {
      auto& ef = x["expert_files"] = nlohmann::json::array();
      for (const auto& e : mr.expert_files) {
        const std::string buf = formats::deepspeed::expert_states_name(e.moe_id, e.expert, mr.mp);
        nlohmann::json names = nlohmann::json::array();
        for (const auto& en : e.entries) names.push_back(en.first);
        ef.push_back({{"file", buf}, {"ep_rank", e.entries.empty() ? 0 : e.entries[0].second[0]}, {"params", names}});
      }
    }
    mps.push_back(x);
  }
  auto& ranks = j["ranks"] = nlohmann::json::array();
  for (int s = 0; s < target.pp; ++s)
    for (int d = 0; d < target.dp; ++d)
      for (int t = 0; t < target.tp; ++t) {
        const auto& mr = mp_ranks[s * target.tp + t];
        nlohmann::json r = {{"rank", global_rank(s, d, t)},
                            {"pp_rank", s},
                            {"dp_rank", d},
                            {"tp_rank", t},
                            {"mp_rank", mr.mp},
                            {"optim_file", optim_file(d, mr.mp)}};
        if (target.zero_stage == 3) r["model_file"] = zero3_model_file(d, mr.mp);
        auto& parts = r["partitions"] = nlohmann::json::array();
        for (const auto& g : mr.groups) {
          const auto p = partition_of(g, d);
          nlohmann::json frs = nlohmann::json::array();
          for (const auto& f : p.fragments)
            frs.push_back({{"name", m.params[g.slots[f.slot].param].name},
                           {"start", f.start},
                           {"numel", f.numel},
                           {"param_offset", f.param_offset}});
          parts.push_back({{"group", g.group}, {"padding", p.padding}, {"fragments", frs}});
        }
        if (!mr.expert_groups.empty()) {
          const auto [er, edp] = ep_coords(d);
          r["ep_rank"] = er;
          r["expert_dp_rank"] = edp;
          for (const auto& g : mr.expert_groups[er]) {
            const auto p = partition_of(g, edp);
            nlohmann::json frs = nlohmann::json::array();
            for (const auto& f : p.fragments)
              frs.push_back({{"name", g.slots[f.slot].name},
                             {"atomic", m.params[g.slots[f.slot].param].name},
                             {"start", f.start},
                             {"numel", f.numel},
                             {"param_offset", f.param_offset}});
            parts.push_back({{"group", g.group},
                             {"moe", true},
                             {"partition_count", g.partition_count},
                             {"padding", p.padding},
                             {"fragments", frs}});
          }
        }
        ranks.push_back(r);
      }
  std::sort(ranks.begin(), ranks.end(), [](const auto& a, const auto& b) { return a["rank"] < b["rank"]; });
  return j;
}

}  // namespace ucpkit::reshard
