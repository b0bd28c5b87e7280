// Reading a universal checkpoint's model description: manifest.json, param_shapes, Megatron args.
#include "reshard/model_info.h"

#include <algorithm>
#include <array>
#include <memory>
#include <cctype>
#include <filesystem>
#include <optional>
#include <set>
#include <stdexcept>

#include "core/confine.h"
#include "core/error.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/module_tree.h"
#include "formats/deepspeed/moe.h"
#include "formats/deepspeed/param_groups.h"
#include "formats/deepspeed/pipeline.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/training_config.h"
#include "formats/dcp/key_record.h"
#include "formats/universal/manifest.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

using pickle::Kind;
using pickle::ValuePtr;

int ModelInfo::param_index(const std::string& name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == name) return static_cast<int>(i);
  return -1;
}

int64_t pad_vocab(int64_t vocab, int64_t multiple, int tp) {
  const int64_t m = multiple * tp;
  return (vocab + m - 1) / m * m;
}

int64_t infer_vocab_multiple(int64_t vocab, int64_t padded, int tp) {
  for (int64_t m = 128; m >= 1; m /= 2)
    if (pad_vocab(vocab, m, tp) == padded) return m;
  throw Error("padded_vocab_size " + std::to_string(padded) + " is not vocab " + std::to_string(vocab) +
              " padded to a power-of-two multiple of tp=" + std::to_string(tp) + " (pass --vocab-multiple)");
}

namespace {

// Names in flat-buffer order per group, from a model file's param_shapes.
std::vector<std::vector<std::string>> group_lists(const ValuePtr& root, const std::string& path) {
  std::vector<std::vector<std::string>> out;
  auto ps = formats::deepspeed::raw_param_shapes(root);
  if (!ps || !ps->is_sequence()) fail(path, "no param_shapes list (needed for the optimizer group layout)");
  for (const auto& g : ps->items) {
    if (!g || g->kind != Kind::Dict) fail(path, "param_shapes entry is not a dict");
    std::vector<std::string> names;
    for (const auto& [k, v] : g->entries) names.push_back(k->as_str());
    out.push_back(std::move(names));
  }
  return out;
}

// Native MoE: the optimizer group of each parameter, from the files (docs/deepspeed-models.md), in this order:
// 1. the model file's param_shapes, one ordered dict per optimizer group in param_groups order, the
//    experts under EP rank 0's local names (DeepSpeed >= 0.19.3 saves them with MoE checkpoints too:
//    engine.py v0.19.6 :4897-4902 _common_checkpoint_state, :5308-5345 _get_zero_param_shapes);
// 2. a model saved by Megatron's script (formats/deepspeed/param_groups.h saved_by_megatron): Megatron's
//    decay rule, matched against the groups' weight_decay and moe flag;
// 3. one dense and one expert group (DeepSpeed's MoE tutorial grouping, moe/utils.py :72-148): every
//    dense parameter in the one, every expert in the other.
// Anything else is refused, naming what the files do not say.
using GroupRule = std::function<int(const ParamInfo&)>;

int expert_local_index(const ModelInfo& m, const ParamInfo& p) {
  const int per = m.num_experts.at(std::max(0, p.moe_id)) / std::max(1, m.source_ep);
  return per > 0 ? p.expert % per : p.expert;
}

std::optional<GroupRule> param_shapes_rule(const ModelInfo& m, const ValuePtr& first, size_t n_groups) {
  auto ps = formats::deepspeed::raw_param_shapes(first);
  if (!ps || !ps->is_sequence()) return std::nullopt;  // 0.14 - 0.19.2 MoE files, or saved without ZeRO
  const auto lists = group_lists(first, m.model_files[0]);
  if (lists.size() != n_groups)
    fail(m.model_files[0], "param_shapes lists " + std::to_string(lists.size()) + " groups but the optimizer has " +
                               std::to_string(n_groups) + " param_groups");
  auto group_of_name = std::make_shared<std::map<std::string, int>>();
  for (size_t g = 0; g < lists.size(); ++g)
    for (const auto& name : lists[g]) group_of_name->emplace(name, static_cast<int>(g));
  const std::string path = m.model_files[0];
  return [&m, group_of_name, path](const ParamInfo& p) {
    const std::string key =
        p.expert >= 0 ? formats::deepspeed::with_expert_index(p.name, expert_local_index(m, p)) : p.name;
    auto it = group_of_name->find(key);
    if (it == group_of_name->end()) fail(path, "parameter " + key + " is in no param_shapes group");
    return it->second;
  };
}

GroupRule megatron_rule(const std::vector<formats::deepspeed::SavedParamGroup>& groups, const std::string& opt) {
  std::array<int, 2> dense = {-1, -1}, moe = {-1, -1};
  for (size_t i = 0; i < groups.size(); ++i) {
    int& target = (groups[i].moe ? moe : dense)[groups[i].weight_decay > 0 ? 0 : 1];
    if (target < 0) target = static_cast<int>(i);
  }
  return [dense, moe, opt](const ParamInfo& p) {
    const int slot = formats::deepspeed::megatron_group_slot(p.name, p.shape);
    const int g = (p.expert >= 0 ? moe : dense)[slot];
    if (g < 0)
      fail(opt, "no " + std::string(slot == 0 ? "weight-decay" : "no-decay") + (p.expert >= 0 ? " expert" : "") +
                    " param group for " + p.name + " (Megatron's decay rule: the model files carry Megatron's args)");
    return g;
  };
}

// Rule 3, or the refusal.
GroupRule one_dense_one_expert_rule(const std::vector<formats::deepspeed::SavedParamGroup>& groups, const std::string& opt,
                                    const std::string& model_file) {
  std::vector<int> dense, moe;
  std::string names;
  for (size_t i = 0; i < groups.size(); ++i) {
    (groups[i].moe ? moe : dense).push_back(static_cast<int>(i));
    names += (names.empty() ? "" : ", ") + (groups[i].name.empty() ? std::string("(unnamed)") : "'" + groups[i].name + "'") +
             (groups[i].moe ? " (moe)" : "");
  }
  if (dense.size() != 1 || moe.size() != 1)
    fail(opt, std::to_string(dense.size()) + " dense and " + std::to_string(moe.size()) + " expert param groups (" + names +
                  ") and no param_shapes in " + model_file + ": which parameter is in which group is not recorded "
                  "(DeepSpeed >= 0.19.3 saves param_shapes with MoE checkpoints; Megatron's decay rule applies only to "
                  "models saved by Megatron's script, whose model files carry its args)");
  const int d = dense[0], e = moe[0];
  return [d, e](const ParamInfo& p) { return p.expert >= 0 ? e : d; };
}

GroupRule moe_group_rule(const ModelInfo& m, const ValuePtr& first, const std::vector<formats::deepspeed::SavedParamGroup>& groups,
                         const std::string& opt) {
  if (auto rule = param_shapes_rule(m, first, groups.size())) return *rule;
  if (formats::deepspeed::saved_by_megatron(first)) return megatron_rule(groups, opt);
  return one_dense_one_expert_rule(groups, opt, m.model_files[0]);
}

// Each expert's moe_id: the rank of its MoE layer among the experts' layers.
void number_moe_layers(std::map<std::string, ParamInfo>& by_name) {
  std::set<int> layers;
  for (const auto& [n, p] : by_name)
    if (p.expert >= 0) layers.insert(p.moe_layer);
  const std::vector<int> list(layers.begin(), layers.end());
  for (auto& [n, p] : by_name)
    if (p.expert >= 0) p.moe_id = static_cast<int>(std::find(list.begin(), list.end(), p.moe_layer) - list.begin());
}

// Native MoE: dense params follow the module order, expert params (layer, global expert, name
// order); each in the optimizer group moe_group_rule gives, dense ones in dense groups and experts in
// expert ('moe') groups.
void read_moe_groups(ModelInfo& m, std::map<std::string, ParamInfo>& by_name, const ValuePtr& first,
                     const ValuePtr& osd, const fs::path& opt) {
  auto list = osd && osd->kind == Kind::Dict ? osd->get("param_groups") : nullptr;
  if (!list || !list->is_sequence()) fail(opt.string(), "no param_groups");
  if (m.num_experts.empty()) throw Error("manifest.json: native MoE checkpoint without source.num_experts");
  const auto groups = formats::deepspeed::saved_param_groups(list->items);
  number_moe_layers(by_name);
  const GroupRule rule = moe_group_rule(m, first, groups, opt.string());
  auto group_of = [&](const ParamInfo& p) {
    const int g = rule(p);
    if (g < 0 || g >= static_cast<int>(groups.size()) || groups[g].moe != (p.expert >= 0))
      fail(opt.string(), "parameter " + p.name + (p.expert >= 0 ? " (an expert)" : " (dense)") + " falls in param group " +
                             std::to_string(g) + (groups.at(std::max(0, g)).moe ? ", an expert group" : ", a dense group"));
    return g;
  };
  m.groups = static_cast<int>(groups.size());
  std::set<std::string> placed;
  for (const auto& entry : formats::deepspeed::module_tensors(formats::deepspeed::raw_module(first))) {
    auto it = by_name.find(entry.first);  // flat or Megatron's nested module
    if (it == by_name.end() || it->second.expert >= 0) continue;
    it->second.group = group_of(it->second);
    m.params.push_back(it->second);
    placed.insert(it->first);
  }
  for (auto& [n, p] : by_name)
    if (p.expert < 0 && !placed.count(n))
      throw Error("manifest.json: parameter " + n + " is not in the model file's module");
  std::vector<ParamInfo> experts;
  std::set<int> expert_groups;
  for (auto& [n, p] : by_name)
    if (p.expert >= 0) {
      p.group = group_of(p);
      expert_groups.insert(p.group);
      experts.push_back(p);
    }
  m.expert_group_of.assign(expert_groups.begin(), expert_groups.end());
  std::stable_sort(experts.begin(), experts.end(), [&](const ParamInfo& a, const ParamInfo& b) {
    if (a.moe_layer != b.moe_layer) return a.moe_layer < b.moe_layer;
    if (a.expert != b.expert) return a.expert < b.expert;
    return a.manifest_index < b.manifest_index;
  });
  for (auto& p : experts) m.params.push_back(std::move(p));
}

// The DP-rank-0 model file of each TP rank among a ZeRO-3 source's zero_pp_rank_D_mp_rank_TT files.
std::vector<std::string> zero3_templates(const std::vector<std::string>& files, int tp, const std::string& manifest) {
  std::vector<std::string> out;
  for (int t = 0; t < tp; ++t) {
    const std::string name = formats::deepspeed::zero3_model_states_name(0, t);
    auto it = std::find_if(files.begin(), files.end(), [&](const std::string& f) { return fs::path(f).filename() == name; });
    if (it == files.end()) throw Error(manifest + ": ZeRO-3 source without " + name + " in model_files");
    out.push_back(*it);
  }
  return out;
}

// ZeRO-3: the optimizer group of every sub-group (formats/deepspeed/optimizer_shard.h), from the
// param_groups the universal optimizer_state.pt carries over from the shards.
std::vector<int> sub_group_owners(const ValuePtr& osd, const std::string& path, size_t sub_groups) {
  auto groups = osd && osd->kind == Kind::Dict ? osd->get("param_groups") : nullptr;
  if (!groups || !groups->is_sequence()) fail(path, "no param_groups (needed to place ZeRO-3 sub-groups)");
  return formats::deepspeed::zero3_sub_group_owners(groups->items, sub_groups, path);
}

}  // namespace

// --- Steps of model_info_from (model_info.h) ---

ModelInfo source_model_info(const UniversalMeta& meta, const formats::universal::UniversalSource& src) {
  ModelInfo m;
  m.source_tp = src.tp_or_1();
  m.source_pp = src.pp_or_1();
  m.source_dp = src.dp_or_1();
  m.source_ep = src.ep_or_1();
  m.pipeline = src.pipeline.value_or(false);
  m.layer_model_axis = src.layer_model_axis.value_or(true);
  m.tag = src.tag.value_or(m.tag);
  // Only the folder's own config.json and generation_config.json: a manifest cannot point the copy anywhere else.
  if (const auto hf = src.facts.find("hf"); hf != src.facts.end() && hf->is_object() && hf->value("names", "") == "transformers" &&
                                            hf->value("config", "") == "config.json" && !meta.dir.empty())
    for (const char* f : {"config.json", "generation_config.json"})
      if (fs::is_regular_file(fs::path(meta.dir) / f)) m.hf_files.push_back((fs::path(meta.dir) / f).string());
  m.data_before_expert = src.data_before_expert.value_or(false);
  m.ds_line = src.ds_line.value_or("");
  if (!src.autoep.is_null()) {
    m.autoep = true;
    m.autoep_layers = src.autoep;
  }
  m.num_experts = src.num_experts.value_or(std::vector<int>{});
  m.source_zero_stage = src.zero_stage.value_or(0);
  m.patterns_json = meta.manifest.patterns_set;
  m.patterns = patterns::PatternSet::from_json(m.patterns_json, "manifest");
  m.model_files = meta.model_files;
  const bool zero3 = m.source_zero_stage == 3;
  const int per_rank = zero3 ? m.source_dp : 1;  // ZeRO-3: every DP rank has its own model file
  if ((int)m.model_files.size() != m.source_tp * m.source_pp * per_rank)
    throw Error(meta.manifest_path + ": " + std::to_string(m.model_files.size()) +
                " model files listed but the source layout has " + (zero3 ? "tp*dp = " : "tp*pp = ") +
                std::to_string(m.source_tp * m.source_pp * per_rank));
  return m;
}

std::map<std::string, ParamInfo> params_from_manifest(ModelInfo& m, const UniversalMeta& meta) {
  const bool on_disk = !meta.dir.empty();
  std::map<std::string, ParamInfo> by_name;
  std::set<std::string> states;
  for (const auto& e : meta.manifest.params) {
    ParamInfo p;
    p.name = e.name;
    p.shape = e.shape;
    p.rule = patterns::classify(m.patterns, p.name);
    p.stored_numel = numel_of(p.shape);
    // ds_to_universal's ZeRO-3 TP = 1 form keeps the vocabulary padding: the universal tensor is the
    // first original_vocab_size rows (the same rows the TP > 1 form keeps), the padding is dropped.
    if (e.flat && p.rule.vocab && m.patterns.original_vocab_size && !p.shape.empty() &&
        p.shape[0] > *m.patterns.original_vocab_size)
      p.shape[0] = *m.patterns.original_vocab_size;
    p.step = e.step;
    p.flat = e.flat;
    p.manifest_index = static_cast<int>(by_name.size());
    if (e.autoep) {
      p.autoep_experts = e.autoep->num_experts;
      p.moe_id = e.autoep->moe_layer_id;
      if (!m.autoep || p.autoep_experts < 1)
        throw Error(meta.manifest_path + ": AutoEP expert weight " + p.name + " without source.autoep");
    }
    if (e.expert) {
      m.native_moe = true;
      p.expert = e.expert->global_id;
      p.moe_layer = e.expert->layer;
    }
    for (const auto& [state, s] : e.states) {
      p.state_files[state] = s.file;
      states.insert(state);
      if (s.source_dtype) {
        const auto d = dtype_from_name(*s.source_dtype);
        if (!d || (*d != DType::BFloat16 && *d != DType::Float16))
          throw Error(meta.manifest_path + ": parameter " + p.name + " state " + state + " has the source_dtype " +
                      escaped_brief(*s.source_dtype) + ", not bfloat16 or float16");
        p.source_dtypes[state] = *d;
      }
      if (!on_disk) continue;  // direct mode: the states are read from the source checkpoint
      confined_path(meta.dir, s.file, meta.manifest_path, p.name + " " + state + " file");
      if (!s.crc32) throw Error(meta.manifest_path + ": parameter " + p.name + " state " + state + " has no crc32");
      p.crc32[state] = *s.crc32;
    }
    if (!p.state_files.count("fp32")) throw Error(meta.manifest_path + ": parameter " + p.name + " has no fp32 state");
    by_name[p.name] = std::move(p);
  }
  m.states.push_back("fp32");
  for (const auto& s : states)
    if (s != "fp32") m.states.push_back(s);
  for (const auto& [n, p] : by_name)
    if (p.state_files.size() != m.states.size())
      throw Error(meta.manifest_path + ": parameter " + n + " has " + std::to_string(p.state_files.size()) +
                  " states, others " + std::to_string(m.states.size()));
  return by_name;
}

void read_model_file_facts(ModelInfo& m, const ValuePtr& first, bool data_before_expert_recorded) {
  // The expert/data rank order when the manifest does not record it (a ZeRO-3 AutoEP source): the
  // saved ds_config's use_data_before_expert_parallelism (runtime/constants.py:518).
  if (m.autoep && !data_before_expert_recorded)
    if (auto cfg = formats::deepspeed::raw_ds_config(first); cfg && cfg->kind == Kind::Dict)
      if (auto f = cfg->get(formats::deepspeed::kUseDataBeforeExpertParallelism); f && f->kind == Kind::Bool) m.data_before_expert = f->b;
  const auto config = formats::deepspeed::training_config(first);
  if (config.dtype) m.source_dtype = config.dtype;
  if (config.zero_stage) m.source_config_zero_stage = config.zero_stage;
  const auto sizes = formats::deepspeed::megatron_sizes(first);
  m.heads = sizes.heads;
  m.kv_heads = sizes.kv_heads;
  m.hidden = sizes.hidden;
  m.ffn = sizes.ffn;
  if (!m.patterns.original_vocab_size) return;
  m.original_vocab = *m.patterns.original_vocab_size;
  if (int64_t mult = sizes.vocab_multiple; mult > 0) {
    m.vocab_multiple = mult;
  } else if (m.patterns.padded_vocab_size) {
    m.vocab_multiple = infer_vocab_multiple(m.original_vocab, *m.patterns.padded_vocab_size, m.source_tp);
    m.vocab_multiple_ambiguous =
        m.vocab_multiple > 1 && pad_vocab(m.original_vocab, m.vocab_multiple / 2, m.source_tp) == *m.patterns.padded_vocab_size;
  }
}

namespace {

// Whether the last stage's group `names` lists its copies of earlier stages' parameters (`seen`)
// first (true) or last (false); nullopt when it shows neither (no copy, or nothing but copies).
std::optional<bool> copies_first(const std::vector<std::string>& names, const std::set<std::string>& seen,
                                 const std::string& path, size_t g) {
  size_t copies = 0, leading = 0, trailing = 0;
  for (const auto& name : names) copies += seen.count(name);
  if (copies == 0 || copies == names.size()) return std::nullopt;
  while (leading < names.size() && seen.count(names[leading])) ++leading;
  while (trailing < names.size() && seen.count(names[names.size() - 1 - trailing])) ++trailing;
  if (leading != copies && trailing != copies)
    fail(path, "param_shapes group " + std::to_string(g) + " interleaves pipeline-replicated copies with the "
               "stage's own parameters (neither first nor last)");
  return leading == copies;
}

}  // namespace

void place_dense_params(ModelInfo& m, const std::map<std::string, ParamInfo>& by_name, const StageRoot& stage_root,
                        const ValuePtr& osd, const std::string& opt_path) {
  const bool zero3 = m.source_zero_stage == 3;
  std::set<std::string> seen;
  // Whether the last stage lists its tied copies before its own parameters, per group, from the
  // source's param_shapes; PipelineModule's registration order (tied modules first) when a group does
  // not show it (no tied copy, or nothing else in the group).
  std::optional<bool> tied_first;
  for (int s = 0; s < m.source_pp; ++s) {
    const std::string& path = m.model_files[s * m.source_tp];
    const auto lists = group_lists(stage_root(s), path);
    // ZeRO-3 lists sub-groups, each inside one optimizer param group (in group order).
    const std::vector<int> group_of = zero3 ? sub_group_owners(osd, opt_path, lists.size()) : std::vector<int>();
    m.groups = zero3 ? static_cast<int>(osd->get("param_groups")->items.size())
                     : std::max<int>(m.groups, static_cast<int>(lists.size()));
    for (size_t g = 0; g < lists.size(); ++g) {
      if (s == m.source_pp - 1 && s > 0)
        if (const auto first = copies_first(lists[g], seen, path, g)) {
          if (tied_first && *tied_first != *first)
            fail(path, "param_shapes groups disagree on whether pipeline-replicated copies come first");
          tied_first = first;
        }
      for (const auto& name : lists[g]) {
        if (seen.count(name)) continue;
        auto it = by_name.find(name);
        if (it == by_name.end())
          throw Error(path + ": parameter " + name + " has no entry in manifest.json (incomplete universal checkpoint)");
        seen.insert(name);
        m.params.push_back(it->second);
        m.params.back().group = zero3 ? group_of[g] : static_cast<int>(g);
      }
    }
  }
  for (const auto& [n, p] : by_name)
    if (!seen.count(n)) throw Error("manifest.json: parameter " + n + " appears in no model file's param_shapes");
  m.tied_copy_first = tied_first.value_or(formats::deepspeed::kTiedModulesFirst);
}

void mark_autoep_expert_groups(ModelInfo& m) {
  std::set<int> expert_groups, dense_groups;
  for (const auto& p : m.params) (p.autoep_experts > 0 ? expert_groups : dense_groups).insert(p.group);
  for (int g : expert_groups)
    if (dense_groups.count(g))
      fail(m.model_files[0], "param_shapes group " + std::to_string(g) + " mixes AutoEP expert weights and dense parameters");
  m.expert_group_of.assign(expert_groups.begin(), expert_groups.end());
}

void set_pipeline_positions(ModelInfo& m, const formats::universal::UniversalSource& src, const std::string& manifest_path) {
  std::set<int> blocks, numbered;
  bool any_tied = false;
  for (auto& p : m.params) {
    const auto [idx, local] = formats::deepspeed::split_pipeline_name(p.name);
    if (idx == -2) throw Error("pipeline model parameter " + p.name + " is neither <layer>.<name> nor tied_modules.*");
    p.local = local;
    if (idx >= 0) {
      p.layer = idx;
      numbered.insert(idx);
      if (formats::deepspeed::is_block_local(local)) blocks.insert(idx);
    } else {
      p.tied = true;
      any_tied = true;
    }
  }
  for (auto& p : m.params) p.transformer = p.layer >= 0 && blocks.count(p.layer);
  // Layer-file numbering: the source checkpoint's own record (ucp-union reads its layer files),
  // else the model family's pattern file; never a guess.
  if (!src.pipeline_numbering.is_null())
    m.numbering = formats::deepspeed::pipeline_numbering_from_json(src.pipeline_numbering, manifest_path);
  else
    m.numbering = formats::deepspeed::pipeline_numbering_from_patterns(m.patterns_json, numbered, blocks);
  if (any_tied && m.numbering.embedding < 0)
    throw Error(manifest_path + ": pipeline checkpoint without source.pipeline_numbering (made by an older ucp-union?) and "
                "no pipeline_numbering in its patterns: the layer_NN files of the tied embedding are unknown");
  m.layer_keys = src.layer_keys.value_or(std::map<int, std::vector<std::string>>{});
  for (auto& p : m.params)
    if (p.tied) p.layer = m.numbering.embedding;
  m.tied_head_layer = m.numbering.tied_head;
}

// --- Reading ---

namespace {

// The files model_info_from reads must exist (a missing one: the universal checkpoint is incomplete).
void check_model_files_present(const ModelInfo& m) {
  for (const auto& f : m.model_files)
    if (!fs::exists(f)) throw Error(f + ": missing (the universal checkpoint is incomplete)");
}

void check_state_files_present(const std::map<std::string, ParamInfo>& by_name, const std::string& dir) {
  if (dir.empty()) return;  // direct mode: the states are read from the source checkpoint
  for (const auto& [n, p] : by_name)
    for (const auto& [state, rel] : p.state_files)
      if (!fs::exists(fs::path(dir) / rel))
        throw Error((fs::path(dir) / rel).string() + ": missing (the universal checkpoint is incomplete)");
}

// The manifest's buffers, their files inside the folder and present (on disk, with a checksum).
std::vector<formats::universal::UniversalBuffer> buffers_of(const UniversalMeta& meta) {
  for (const auto& b : meta.manifest.buffers) {
    if (!dtype_from_name(b.dtype)) throw Error(meta.manifest_path + ": buffer " + b.name + " has the unknown dtype " + b.dtype);
    if (meta.dir.empty()) continue;
    const fs::path at = confined_path(meta.dir, b.tensor.file, meta.manifest_path, "buffer " + b.name + " file");
    if (!b.tensor.crc32) throw Error(meta.manifest_path + ": buffer " + b.name + " has no crc32");
    if (!fs::exists(at)) throw Error(at.string() + ": missing (the universal checkpoint is incomplete)");
  }
  return meta.manifest.buffers;
}

// The manifest's items (a DCP's bytes entries), their files inside the folder and present.
std::vector<formats::universal::UniversalItem> items_of(const UniversalMeta& meta) {
  for (const auto& i : meta.manifest.items) {
    if (meta.dir.empty()) continue;
    const fs::path at = confined_path(meta.dir, i.file.file, meta.manifest_path, "item " + i.key + " file");
    if (!i.file.crc32) throw Error(meta.manifest_path + ": item " + i.key + " has no crc32");
    if (!fs::exists(at)) throw Error(at.string() + ": missing (the universal checkpoint is incomplete)");
  }
  return meta.manifest.items;
}

// source.dcp.keys: the keys a DCP source was saved under where they are not get_state_dict's.
nlohmann::json dcp_keys_of(const UniversalMeta& meta) {
  const nlohmann::json& facts = meta.manifest.source.facts;
  const auto dcp = facts.find("dcp");
  if (dcp == facts.end() || !dcp->is_object() || !dcp->contains("keys")) return nlohmann::json::object();
  formats::dcp::check_key_record(dcp->at("keys"), meta.manifest_path);
  return dcp->at("keys");
}

}  // namespace

namespace {

// The common optimizer state of `meta` (read once), or null when the folder has none.
ValuePtr optimizer_state_of(const UniversalMeta& meta) {
  if (meta.optimizer_state) return meta.optimizer_state;
  if (!fs::exists(meta.optimizer_state_path)) return nullptr;
  return load_torch(meta.optimizer_state_path, meta.open);
}

// Universal folders that carry no DeepSpeed model files by design: made from another format than
// DeepSpeed (DCP, torch_dist, ...), or in Megatron-Core names (the condition ucp-info's
// describe_universal_from_dcp uses). A DeepSpeed-sourced manifest listing none is damaged and keeps
// source_model_info's refusal.
bool made_without_model_files(const formats::universal::UniversalSource& source) {
  return source.format_name() != "deepspeed" || source.names == "megatron-core";
}

// A universal folder without DeepSpeed model files: parameters in manifest order, each in the optimizer
// param group whose "params" names it (the DCP and torch_dist sources' param_groups), else group 0.
ModelInfo manifest_only_model_info(const UniversalMeta& meta) {
  ModelInfo m;
  m.manifest_only = true;
  m.patterns_json = meta.manifest.patterns_set;
  if (!m.patterns_json.is_null()) m.patterns = patterns::PatternSet::from_json(m.patterns_json, "manifest");
  auto by_name = params_from_manifest(m, meta);
  check_state_files_present(by_name, meta.dir);
  std::set<std::string> dtypes;
  for (const auto& e : meta.manifest.params) {
    m.params.push_back(by_name.at(e.name));
    if (e.dtype) dtypes.insert(*e.dtype);
  }
  if (dtypes.size() == 1) m.source_dtype = dtype_from_name(*dtypes.begin());
  m.buffers = buffers_of(meta);
  m.items = items_of(meta);
  m.dcp_keys = dcp_keys_of(meta);
  m.optimizer_state = optimizer_state_of(meta);
  const ValuePtr groups = m.optimizer_state && m.optimizer_state->kind == Kind::Dict ? m.optimizer_state->get("param_groups") : nullptr;
  if (groups && groups->is_sequence()) {
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < m.params.size(); ++i) index.emplace(m.params[i].name, i);
    m.groups = static_cast<int>(groups->items.size());
    for (size_t g = 0; g < groups->items.size(); ++g) {
      const ValuePtr& group = groups->items[g];
      const ValuePtr names = group && group->kind == Kind::Dict ? group->get("params") : nullptr;
      if (!names || !names->is_sequence()) continue;
      for (const auto& n : names->items)
        if (n && n->kind == Kind::Str)
          if (auto it = index.find(n->s); it != index.end()) m.params[it->second].group = static_cast<int>(g);
    }
  }
  return m;
}

}  // namespace

ModelInfo model_info_from(const UniversalMeta& meta) {
  const formats::universal::UniversalSource& src = meta.manifest.source;
  if (meta.model_files.empty() && !meta.dir.empty() && made_without_model_files(meta.manifest.source))
    return manifest_only_model_info(meta);
  ModelInfo m = source_model_info(meta, src);
  check_model_files_present(m);
  auto by_name = params_from_manifest(m, meta);
  check_state_files_present(by_name, meta.dir);
  m.buffers = buffers_of(meta);
  if (m.source_zero_stage == 3) m.model_files = zero3_templates(m.model_files, m.source_tp, meta.manifest_path);

  // Model files: group membership and flat-buffer order (stage by stage), Megatron sizes.
  ValuePtr first = load_torch(m.model_files[0], meta.open);
  if (!first || first->kind != Kind::Dict) fail(m.model_files[0], "not a model-states dict");
  read_model_file_facts(m, first, src.data_before_expert.has_value());
  // Optimizer flavour of the source (BF16_Optimizer shards have no zero_stage).
  const fs::path opt = meta.optimizer_state_path;
  ValuePtr osd = meta.optimizer_state;
  if (!osd) {
    if (!fs::exists(opt)) throw Error(opt.string() + ": missing (the universal checkpoint is incomplete)");
    osd = load_torch(opt.string(), meta.open);
  }
  m.optimizer_state = osd;
  m.source_bf16_optimizer = formats::deepspeed::is_bf16_optimizer_state(osd);
  if (m.native_moe) {
    read_moe_groups(m, by_name, first, osd, opt);
    return m;
  }
  place_dense_params(m, by_name, [&](int stage) { return stage == 0 ? first : load_torch(m.model_files[stage * m.source_tp], meta.open); },
                     osd, opt.string());
  if (m.autoep) mark_autoep_expert_groups(m);  // the groups holding the fused expert weights are expert groups
  if (m.pipeline) set_pipeline_positions(m, src, meta.manifest_path);
  return m;
}

namespace {

// Fields of manifest.json of another type than written name the manifest and the key
// (formats::universal::UniversalManifest::from_json); what the pattern set and pipeline numbering readers find
// wrong in it names the manifest too, in one short line.
template <class F>
auto naming_manifest(const std::string& manifest, F&& f) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    throw Error(manifest + ": malformed: " + escaped_brief(e.what(), 160));
  } catch (const std::invalid_argument& e) {
    throw Error(manifest + ": malformed: a number field holds something else (" + escaped_brief(e.what(), 40) + ")");
  } catch (const std::out_of_range& e) {
    throw Error(manifest + ": malformed: a number field is out of range (" + escaped_brief(e.what(), 40) + ")");
  }
}

}  // namespace

UniversalMeta read_universal_meta(const std::string& universal_dir) {
  const fs::path dir(universal_dir);
  if (!fs::is_directory(dir)) throw Error(universal_dir + ": not a folder");
  const std::string manifest = (dir / formats::universal::kUniversalManifestName).string();
  return naming_manifest(manifest, [&] {
    UniversalMeta meta;
    meta.dir = universal_dir;
    meta.manifest_path = manifest;
    meta.manifest = formats::universal::read_universal_manifest(meta.manifest_path);
    for (const auto& f : meta.manifest.model_files)
      meta.model_files.push_back(confined_path(dir, f, meta.manifest_path, "model file").string());
    meta.optimizer_state_path =
        confined_path(dir, meta.manifest.optimizer_state, meta.manifest_path, "optimizer state file").string();
    return meta;
  });
}

ModelInfo read_model_info(const UniversalMeta& meta) {
  return naming_manifest(meta.manifest_path, [&] { return model_info_from(meta); });
}

ModelInfo read_model_info(const std::string& universal_dir) { return read_model_info(read_universal_meta(universal_dir)); }

}  // namespace ucpkit::reshard
