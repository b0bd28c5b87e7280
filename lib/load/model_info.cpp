// Reading a universal checkpoint's model description: manifest.json, param_shapes, Megatron args.
#include "load/model_info.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>

#include "core/confine.h"
#include "core/error.h"
#include "core/json_input.h"
#include "io/torch/torch_file.h"
#include "layout/deepspeed/autoep.h"
#include "layout/deepspeed/module_tree.h"
#include "layout/deepspeed/pipeline.h"
#include "layout/deepspeed/files.h"

namespace fs = std::filesystem;

namespace ucpkit::load {

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

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw Error(p.string() + ": cannot read (incomplete universal checkpoint?)");
  std::stringstream text;
  text << in.rdbuf();
  return parse_json_input(text.str(), p.string(), "corrupt JSON");
}

int64_t arg_int(const ValuePtr& args, const char* field) {
  if (!args || args->kind != Kind::Object) return 0;
  auto a = args->attr(field);
  return a && a->kind == Kind::Int ? a->i : 0;
}

// Names in flat-buffer order per group, from a model file's param_shapes.
std::vector<std::vector<std::string>> group_lists(const ValuePtr& root, const std::string& path) {
  std::vector<std::vector<std::string>> out;
  auto ps = root->get("param_shapes");
  if (!ps || !ps->is_sequence()) fail(path, "no param_shapes list (needed for the optimizer group layout)");
  for (const auto& g : ps->items) {
    if (!g || g->kind != Kind::Dict) fail(path, "param_shapes entry is not a dict");
    std::vector<std::string> names;
    for (const auto& [k, v] : g->entries) names.push_back(k->as_str());
    out.push_back(std::move(names));
  }
  return out;
}

// Native MoE model files have no param_shapes: dense params follow the module order, expert params
// (layer, global expert, name order); optimizer groups follow Megatron's rule (no weight decay for
// biases and norms, i.e. 1-D tensors) matched against the common param_groups (moe flag, decay).
void read_moe_groups(ModelInfo& m, std::map<std::string, ParamInfo>& by_name, const ValuePtr& first,
                     const ValuePtr& osd, const fs::path& opt) {
  auto groups = osd && osd->kind == Kind::Dict ? osd->get("param_groups") : nullptr;
  if (!groups || !groups->is_sequence()) fail(opt.string(), "no param_groups");
  int dense[2] = {-1, -1}, moe[2] = {-1, -1};
  for (size_t i = 0; i < groups->items.size(); ++i) {
    const auto& g = groups->items[i];
    if (!g || g->kind != Kind::Dict) continue;
    const bool is_moe = g->get("moe") && g->get("moe")->kind == Kind::Bool && g->get("moe")->b;
    const auto wd = g->get("weight_decay");
    const int slot = wd && wd->as_float() > 0 ? 0 : 1;
    int& target = is_moe ? moe[slot] : dense[slot];
    if (target < 0) target = static_cast<int>(i);
  }
  auto group_of = [&](const ParamInfo& p, const int* table) {
    const int slot = p.shape.size() >= 2 ? 0 : 1;
    if (table[slot] < 0)
      fail(opt.string(), "no " + std::string(slot == 0 ? "weight-decay" : "no-decay") + (table == moe ? " expert" : "") +
                             " param group for " + p.name);
    return table[slot];
  };
  m.groups = static_cast<int>(groups->items.size());
  m.expert_group_of = {moe[0], moe[1]};
  std::set<std::string> placed;
  auto module = first->get("module");
  for (const auto& entry : layout::module_tensors(module)) {
      const std::string& flat_name = entry.first;  // flat or Megatron's nested module
      auto it = by_name.find(flat_name);
      if (it == by_name.end() || it->second.expert >= 0) continue;
      it->second.group = group_of(it->second, dense);
      m.params.push_back(it->second);
      placed.insert(it->first);
    }
  for (auto& [n, p] : by_name)
    if (p.expert < 0 && !placed.count(n))
      throw Error("manifest.json: parameter " + n + " is not in the model file's module");
  std::vector<ParamInfo> experts;
  std::set<int> layers;
  for (auto& [n, p] : by_name)
    if (p.expert >= 0) {
      p.group = group_of(p, moe);
      experts.push_back(p);
      layers.insert(p.moe_layer);
    }
  std::vector<int> layer_list(layers.begin(), layers.end());
  for (auto& p : experts)
    p.moe_id = static_cast<int>(std::find(layer_list.begin(), layer_list.end(), p.moe_layer) - layer_list.begin());
  std::stable_sort(experts.begin(), experts.end(), [&](const ParamInfo& a, const ParamInfo& b) {
    if (a.moe_layer != b.moe_layer) return a.moe_layer < b.moe_layer;
    if (a.expert != b.expert) return a.expert < b.expert;
    return a.manifest_index < b.manifest_index;
  });
  for (auto& p : experts) m.params.push_back(std::move(p));
  if (m.num_experts.empty()) throw Error("manifest.json: native MoE checkpoint without source.num_experts");
}

// The DP-rank-0 model file of each TP rank among a ZeRO-3 source's zero_pp_rank_D_mp_rank_TT files.
std::vector<std::string> zero3_templates(const std::vector<std::string>& files, int tp, const std::string& manifest) {
  std::vector<std::string> out;
  for (int t = 0; t < tp; ++t) {
    const std::string name = layout::zero3_model_states_name(0, t);
    auto it = std::find_if(files.begin(), files.end(), [&](const std::string& f) { return fs::path(f).filename() == name; });
    if (it == files.end()) throw Error(manifest + ": ZeRO-3 source without " + name + " in model_files");
    out.push_back(*it);
  }
  return out;
}

// ZeRO-3: param_groups[g]["params"] lists the sub-group indices of optimizer group g (the optimizer's
// state_dict numbering of the fp32 sub-group partitions). Returns the group of every sub-group.
std::vector<int> sub_group_owners(const ValuePtr& osd, const std::string& path, size_t sub_groups) {
  auto groups = osd && osd->kind == Kind::Dict ? osd->get("param_groups") : nullptr;
  if (!groups || !groups->is_sequence()) fail(path, "no param_groups (needed to place ZeRO-3 sub-groups)");
  std::vector<int> owner(sub_groups, -1);
  for (size_t g = 0; g < groups->items.size(); ++g) {
    auto ids = groups->items[g] && groups->items[g]->kind == Kind::Dict ? groups->items[g]->get("params") : nullptr;
    if (!ids || !ids->is_sequence()) fail(path, "param_groups[" + std::to_string(g) + "] has no params list");
    for (const auto& id : ids->items) {
      const int64_t sg = id ? id->as_int() : -1;
      if (sg < 0 || sg >= static_cast<int64_t>(sub_groups) || owner[static_cast<size_t>(sg)] >= 0)
        fail(path, "param_groups[" + std::to_string(g) + "] lists sub-group " + std::to_string(sg) + " but the model "
                   "file has " + std::to_string(sub_groups) + " (or it is listed twice)");
      owner[static_cast<size_t>(sg)] = static_cast<int>(g);
    }
  }
  for (size_t sg = 0; sg < sub_groups; ++sg)
    if (owner[sg] < 0) fail(path, "ZeRO-3 sub-group " + std::to_string(sg) + " is in no param group");
  return owner;
}

}  // namespace

static ModelInfo read_model_info_unchecked(const std::string& universal_dir);

// Fields of manifest.json of another type than written (nlohmann's type_error, a crc32 that is not
// hex) name the manifest, in one short line.
ModelInfo read_model_info(const std::string& universal_dir) {
  const std::string manifest = (fs::path(universal_dir) / "manifest.json").string();
  try {
    return read_model_info_unchecked(universal_dir);
  } catch (const nlohmann::json::exception& e) {
    throw Error(manifest + ": malformed: " + escaped_brief(e.what(), 160));
  } catch (const std::invalid_argument& e) {
    throw Error(manifest + ": malformed: a number field holds something else (" + escaped_brief(e.what(), 40) + ")");
  } catch (const std::out_of_range& e) {
    throw Error(manifest + ": malformed: a number field is out of range (" + escaped_brief(e.what(), 40) + ")");
  }
}

static ModelInfo read_model_info_unchecked(const std::string& universal_dir) {
  const fs::path dir(universal_dir);
  if (!fs::is_directory(dir)) throw Error(universal_dir + ": not a folder");
  UniversalMeta meta;
  meta.dir = universal_dir;
  meta.manifest = read_json(dir / "manifest.json");
  meta.manifest_path = (dir / "manifest.json").string();
  if (meta.manifest.value("format", "") != "ucpkit-universal")
    throw Error(meta.manifest_path + ": not a ucpkit universal manifest");
  try {
    for (const auto& f : meta.manifest.at("model_files"))
      meta.model_files.push_back(confined_path(dir, f.get<std::string>(), meta.manifest_path, "model file").string());
  } catch (const nlohmann::json::exception& e) {
    throw Error(meta.manifest_path + ": missing field: " + e.what());
  }
  meta.optimizer_state_path = (dir / "zero" / "optimizer_state.pt").string();
  return model_info_from(meta);
}

ModelInfo model_info_from(const UniversalMeta& meta) {
  const bool on_disk = !meta.dir.empty();
  const fs::path dir(meta.dir);
  const auto& manifest = meta.manifest;
  ModelInfo m;
  try {
    const auto& src = manifest.at("source");
    m.source_tp = src.value("tp", 1);
    m.source_pp = src.value("pp", 1);
    m.source_dp = src.value("dp", 1);
    m.source_ep = src.value("ep", 1);
    m.pipeline = src.value("pipeline", false);
    m.tag = src.value("tag", m.tag);
    m.data_before_expert = src.value("data_before_expert", false);
    m.ds_line = src.value("ds_line", std::string());
    if (src.contains("autoep")) {
      m.autoep = true;
      m.autoep_layers = src["autoep"];
    }
    if (src.contains("num_experts")) m.num_experts = src["num_experts"].get<std::vector<int>>();
    if (src.contains("zero_stage") && src["zero_stage"].is_number_integer()) m.source_zero_stage = src["zero_stage"];
    m.patterns_json = manifest.at("patterns").at("set");
    m.model_files = meta.model_files;
  } catch (const nlohmann::json::exception& e) {
    throw Error(meta.manifest_path + ": missing field: " + e.what());
  }
  m.patterns = patterns::PatternSet::from_json(m.patterns_json, "manifest");
  const bool zero3 = m.source_zero_stage == 3;
  const int per_rank = zero3 ? m.source_dp : 1;  // ZeRO-3: every DP rank has its own model file
  if ((int)m.model_files.size() != m.source_tp * m.source_pp * per_rank)
    throw Error(meta.manifest_path + ": " + std::to_string(m.model_files.size()) +
                " model files listed but the source layout has " + (zero3 ? "tp*dp = " : "tp*pp = ") +
                std::to_string(m.source_tp * m.source_pp * per_rank));
  for (const auto& f : m.model_files)
    if (!fs::exists(f)) throw Error(f + ": missing (the universal checkpoint is incomplete)");
  if (zero3) m.model_files = zero3_templates(m.model_files, m.source_tp, meta.manifest_path);

  // Parameters as the manifest lists them.
  std::map<std::string, ParamInfo> by_name;
  std::set<std::string> states;
  for (const auto& e : manifest.at("params")) {
    if (e.is_null()) throw Error(meta.manifest_path + ": a parameter entry is empty");
    ParamInfo p;
    p.name = e.at("name").get<std::string>();
    p.shape = e.at("shape").get<std::vector<int64_t>>();
    p.rule = patterns::classify(m.patterns, p.name);
    p.stored_numel = 1;
    for (auto d : p.shape) p.stored_numel *= d;
    // ds_to_universal's ZeRO-3 TP = 1 form keeps the vocabulary padding: the universal tensor is the
    // first original_vocab_size rows (the same rows the TP > 1 form keeps), the padding is dropped.
    if (e.value("flat", false) && p.rule.vocab && m.patterns.original_vocab_size && !p.shape.empty() &&
        p.shape[0] > *m.patterns.original_vocab_size)
      p.shape[0] = *m.patterns.original_vocab_size;
    p.step = e.value("step", false);
    p.flat = e.value("flat", false);
    p.manifest_index = static_cast<int>(by_name.size());
    if (e.contains("autoep")) {
      p.autoep_experts = e["autoep"].at("num_experts").get<int>();
      p.moe_id = e["autoep"].at("moe_layer_id").get<int>();
      if (!m.autoep || p.autoep_experts < 1)
        throw Error(meta.manifest_path + ": AutoEP expert weight " + p.name + " without source.autoep");
    }
    if (e.contains("expert")) {
      m.native_moe = true;
      p.expert = e["expert"].value("global_id", -1);
      p.moe_layer = e["expert"].value("layer", -1);
    }
    for (const auto& [state, v] : e.at("states").items()) {
      p.state_files[state] = v.at("file").get<std::string>();
      states.insert(state);
      if (!on_disk) continue;  // direct mode: the states are read from the source checkpoint
      confined_path(dir, p.state_files[state], meta.manifest_path, p.name + " " + state + " file");
      p.crc32[state] = static_cast<uint32_t>(std::stoul(v.at("crc32").get<std::string>(), nullptr, 16));
      if (!fs::exists(dir / p.state_files[state]))
        throw Error((dir / p.state_files[state]).string() + ": missing (the universal checkpoint is incomplete)");
    }
    if (!p.state_files.count("fp32")) throw Error((dir / "manifest.json").string() + ": parameter " + p.name + " has no fp32 state");
    by_name[p.name] = std::move(p);
  }
  m.states.push_back("fp32");
  for (const auto& s : states)
    if (s != "fp32") m.states.push_back(s);
  for (const auto& [n, p] : by_name)
    if (p.state_files.size() != m.states.size())
      throw Error((dir / "manifest.json").string() + ": parameter " + n + " has " + std::to_string(p.state_files.size()) + " states, others " +
                  std::to_string(m.states.size()));

  // Model files: group membership and flat-buffer order (stage by stage), Megatron sizes.
  ValuePtr first = load_torch(m.model_files[0]);
  if (!first || first->kind != Kind::Dict) fail(m.model_files[0], "not a model-states dict");
  // The expert/data rank order when the manifest does not record it (a ZeRO-3 AutoEP source): the
  // saved ds_config's use_data_before_expert_parallelism (runtime/constants.py:518).
  if (m.autoep && !manifest.at("source").contains("data_before_expert"))
    if (auto cfg = first->get("ds_config"); cfg && cfg->kind == Kind::Dict)
      if (auto f = cfg->get(layout::kUseDataBeforeExpertParallelism); f && f->kind == Kind::Bool) m.data_before_expert = f->b;
  auto args = first->get("args");
  m.heads = arg_int(args, "num_attention_heads");
  m.kv_heads = arg_int(args, "num_key_value_heads");
  m.hidden = arg_int(args, "hidden_size");
  m.ffn = arg_int(args, "ffn_hidden_size");
  if (m.patterns.original_vocab_size) {
    m.original_vocab = *m.patterns.original_vocab_size;
    if (int64_t mult = arg_int(args, "make_vocab_size_divisible_by"); mult > 0)
      m.vocab_multiple = mult;
    else if (m.patterns.padded_vocab_size)
    {
      m.vocab_multiple = infer_vocab_multiple(m.original_vocab, *m.patterns.padded_vocab_size, m.source_tp);
      m.vocab_multiple_ambiguous =
          m.vocab_multiple > 1 &&
          pad_vocab(m.original_vocab, m.vocab_multiple / 2, m.source_tp) == *m.patterns.padded_vocab_size;
    }
  }
  // Optimizer flavour of the source (BF16_Optimizer shards have no zero_stage).
  const fs::path opt = meta.optimizer_state_path;
  ValuePtr osd = meta.optimizer_state;
  if (!osd) {
    if (!fs::exists(opt)) throw Error(opt.string() + ": missing (the universal checkpoint is incomplete)");
    osd = load_torch(opt.string());
  }
  m.source_bf16_optimizer = osd && osd->kind == Kind::Dict && !osd->contains("zero_stage");
  if (m.native_moe) {
    read_moe_groups(m, by_name, first, osd, opt);
    return m;
  }

  std::set<std::string> seen;
  // Whether the last stage lists its tied copies before its own parameters, per group, from the
  // source's param_shapes; PipelineModule's registration order (tied modules first) when a group does
  // not show it (no tied copy, or nothing else in the group).
  std::optional<bool> tied_first;
  for (int s = 0; s < m.source_pp; ++s) {
    const std::string& path = m.model_files[s * m.source_tp];
    ValuePtr root = s == 0 ? first : load_torch(path);
    const auto lists = group_lists(root, path);
    // ZeRO-3 lists sub-groups, each inside one optimizer param group (in group order).
    const std::vector<int> group_of = zero3 ? sub_group_owners(osd, opt.string(), lists.size())
                                            : std::vector<int>();
    m.groups = zero3 ? static_cast<int>(osd->get("param_groups")->items.size())
                     : std::max<int>(m.groups, static_cast<int>(lists.size()));
    for (size_t g = 0; g < lists.size(); ++g) {
      if (s == m.source_pp - 1 && s > 0) {
        // Copies (names already seen on an earlier stage) must form a prefix or a suffix of the group.
        size_t copies = 0, leading = 0;
        for (const auto& name : lists[g]) copies += seen.count(name);
        while (leading < lists[g].size() && seen.count(lists[g][leading])) ++leading;
        if (copies > 0 && copies < lists[g].size()) {
          const bool first = leading == copies;
          size_t trailing = 0;
          while (trailing < lists[g].size() && seen.count(lists[g][lists[g].size() - 1 - trailing])) ++trailing;
          if (!first && trailing != copies)
            fail(path, "param_shapes group " + std::to_string(g) + " interleaves pipeline-replicated copies with the "
                       "stage's own parameters (neither first nor last)");
          if (tied_first && *tied_first != first)
            fail(path, "param_shapes groups disagree on whether pipeline-replicated copies come first");
          tied_first = first;
        }
      }
      for (size_t k = 0; k < lists[g].size(); ++k) {
        const auto& name = lists[g][k];
        if (seen.count(name)) continue;
        auto it = by_name.find(name);
        if (it == by_name.end())
          throw Error(path + ": parameter " + name + " has no entry in manifest.json (incomplete universal checkpoint)");
        seen.insert(name);
        it->second.group = zero3 ? group_of[g] : static_cast<int>(g);
        m.params.push_back(it->second);
      }
    }
  }
  for (const auto& [n, p] : by_name)
    if (!seen.count(n)) throw Error("manifest.json: parameter " + n + " appears in no model file's param_shapes");

  m.tied_copy_first = tied_first.value_or(layout::kTiedModulesFirst);

  if (m.autoep) {  // the groups holding the fused expert weights are expert groups (ep_size_<EP>)
    std::set<int> expert_groups, dense_groups;
    for (const auto& p : m.params) (p.autoep_experts > 0 ? expert_groups : dense_groups).insert(p.group);
    for (int g : expert_groups)
      if (dense_groups.count(g))
        fail(m.model_files[0], "param_shapes group " + std::to_string(g) + " mixes AutoEP expert weights and dense parameters");
    m.expert_group_of.assign(expert_groups.begin(), expert_groups.end());
  }

  if (m.pipeline) {
    std::set<int> blocks, numbered;
    bool any_tied = false;
    for (auto& p : m.params) {
      const auto [idx, local] = layout::split_pipeline_name(p.name);
      if (idx == -2) throw Error("pipeline model parameter " + p.name + " is neither <layer>.<name> nor tied_modules.*");
      p.local = local;
      if (idx >= 0) {
        p.layer = idx;
        numbered.insert(idx);
        if (layout::is_block_local(local)) blocks.insert(idx);
      } else {
        p.tied = true;
        any_tied = true;
      }
    }
    for (auto& p : m.params) p.transformer = p.layer >= 0 && blocks.count(p.layer);
    // Layer-file numbering: the source checkpoint's own record (ucp-union reads its layer files),
    // else the model family's pattern file; never a guess.
    const std::string& mpath = meta.manifest_path;
    if (manifest.at("source").contains("pipeline_numbering"))
      m.numbering = layout::pipeline_numbering_from_json(manifest["source"]["pipeline_numbering"], mpath);
    else
      m.numbering = layout::pipeline_numbering_from_patterns(m.patterns_json, numbered, blocks);
    if (any_tied && m.numbering.embedding < 0)
      throw Error(mpath + ": pipeline checkpoint without source.pipeline_numbering (made by an older ucp-union?) and "
                  "no pipeline_numbering in its patterns: the layer_NN files of the tied embedding are unknown");
    if (const auto& src = manifest.at("source"); src.contains("layer_keys") && src["layer_keys"].is_object())
      for (const auto& [idx, keys] : src["layer_keys"].items()) m.layer_keys[std::stoi(idx)] = keys.get<std::vector<std::string>>();
    for (auto& p : m.params)
      if (p.tied) p.layer = m.numbering.embedding;
    m.tied_head_layer = m.numbering.tied_head;
  }

  return m;
}

}  // namespace ucpkit::load
