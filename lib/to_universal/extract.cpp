// Extract planning of ZeRO-1/2 and BF16_Optimizer checkpoints (ZeRO-3: extract_zero3.cpp): the model
// states and expert files read into plain data, the patterns chosen, every optimizer shard's param groups
// mapped to fragments (fragment_map.h) and checked complete; and reading a work folder's plan.
#include "to_universal/extract.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/json_input.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/autoep_json.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/module_tree.h"
#include "formats/deepspeed/moe.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/pipeline.h"
#include "formats/deepspeed/version_line.h"
#include "to_universal/extract_zero3.h"
#include "to_universal/fragment_map.h"
#include "to_universal/plan_source.h"
#include "to_universal/shard_agreement.h"
#include "to_universal/shard_reader.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

// name -> TP-local shape of one model-parallel rank: param_shapes when present; else (native MoE
// files before DeepSpeed 0.19.3) the module tensors, flat or Megatron's nested dict, and the expert files.
void collect_shapes(const formats::deepspeed::ModelStates& model, std::map<std::string, std::vector<int64_t>>& shapes) {
  if (auto ps = formats::deepspeed::saved_param_shapes(model)) {
    for (const auto& group : ps->groups)
      for (const auto& [name, shape] : group) shapes[name] = shape;
    return;
  }
  for (const auto& [name, v] : model.module) shapes[name] = v->tensor->shape();
}

// Layer-file numbering of a PipelineModule source, read from its own files: which layer_NN holds
// the tied embedding and the tied head (their names carry no index), blocks and final norm from the
// parameter names. Every TP-rank-0 layer file is opened (keys only): `keys` gets each file's key order
// (the layer module's registration order, which the target's layer files keep).
formats::deepspeed::PipelineNumbering pipeline_numbering_of(const formats::deepspeed::DeepSpeedLayout& L, const ExtractPlan& plan,
                                                std::map<int, std::vector<std::string>>& keys, const TorchLoadOptions& open) {
  std::set<int> numbered, blocks;
  std::set<std::string> tied;
  for (const auto& p : plan.params) {
    const auto [idx, local] = formats::deepspeed::split_pipeline_name(p.name);
    if (idx >= 0) {
      numbered.insert(idx);
      if (formats::deepspeed::is_block_local(local)) blocks.insert(idx);
    } else if (idx == -1) {
      tied.insert(local);
    }
  }
  for (const auto& [idx, files] : L.layer_files) {
    if (files.empty()) continue;
    FileScope scope(files[0]);
    ValuePtr root = load_torch(files[0], open);
    auto& k = keys[idx];
    if (root && root->kind == Kind::Dict)
      for (const auto& [key, v] : root->entries) k.push_back(key->as_str());
  }
  try {
    return formats::deepspeed::detect_pipeline_numbering(keys, numbered, blocks, tied);
  } catch (const Error& e) {
    throw Error(L.dir + ": " + e.what());
  }
}

// AutoEP under ZeRO-1/2 (docs/formats.md "AutoEP"): TP = PP = 1; num_experts lists each layer's E;
// the expert group's param_shapes hold [num_local_experts, ...] for <prefix>.w1/w2/w3; and exactly the
// files layer_<id>_expert_<g>_mp_rank_00_model_states.pt, g < E, each holding <prefix>.w{1,2,3}.<g> of
// that shape without the expert dimension (engine.py:5029-5054). Fills `param` (weight -> layer index).
void check_autoep_files(const formats::deepspeed::DeepSpeedLayout& L, const std::vector<formats::deepspeed::AutoEpLayer>& autoep,
                        const std::vector<int>& num_experts, const std::map<std::string, std::vector<int64_t>>& shapes,
                        std::map<std::string, size_t>& param, const TorchLoadOptions& open) {
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
    for (const auto& w : formats::deepspeed::autoep_weight_names()) {
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
    std::map<std::string, std::vector<int64_t>> fused;  // "w1" -> [num_local_experts, ...]
    for (const auto& w : formats::deepspeed::autoep_weight_names()) fused[w] = shapes.at(a.expert_key_prefix + "." + w);
    formats::deepspeed::check_autoep_expert_file(load_torch(ef.path, open), ef.path, a, ef.expert, fused);
    found.emplace(a.moe_layer_id, ef.expert);
  }
  for (const auto& a : autoep)
    for (int e = 0; e < a.num_experts; ++e)
      if (!found.count({a.moe_layer_id, e}))
        fail((fs::path(L.dir) / formats::deepspeed::expert_states_name(a.moe_layer_id, e, 0)).string(),
             "missing shard (AutoEP layer " + a.expert_key_prefix + " expert " + std::to_string(e) + " of " +
                 std::to_string(a.num_experts) + ")");
}

// What the model-states files of every model-parallel rank give the ZeRO-1/2 plan.
struct ModelFacts {
  std::vector<ShapeMap> shapes;            // per (pp, tp): name -> TP-local shape
  ValuePtr uc_info;                        // mp rank 0's universal_checkpoint_info
  std::vector<int> num_experts;            // native MoE / AutoEP: experts per MoE layer
  bool data_before_expert = false;         // AutoEP: the model file's ds_config decides the rank order
  formats::deepspeed::MoeFileFacts facts;              // what DeepSpeed version line the native MoE files follow
  std::vector<formats::deepspeed::AutoEpLayer> autoep;  // DeepSpeed AutoEP layers (ds_autoep_layers is a list)
};

// Model states of every (pp, tp): shapes, world sizes (checked), patterns, MoE facts; each file's
// identity recorded in `agreement`.
ModelFacts read_model_facts(const formats::deepspeed::DeepSpeedLayout& L, ShardAgreement& agreement,
                            const TorchLoadOptions& open) {
  ModelFacts m;
  m.shapes.resize(L.mp_count());
  m.facts.expp_files = !L.expert_optim_files.empty();
  for (int mp = 0; mp < L.mp_count(); ++mp) {
    const auto& path = L.model_files[mp];
    FileScope scope(path);
    ValuePtr root = load_torch(path, open);
    const formats::deepspeed::ModelStates model = formats::deepspeed::read_rank_model_states(root, path);
    if (const auto dp = model.dp_world_size; dp && *dp != L.dp) {
      if (*dp > 0 && *dp < L.dp)
        throw Error(L.optim_files[mp][*dp] + ": extra shard: " + path + " says dp_world_size is " + std::to_string(*dp) +
                    " but ZeRO shards up to rank " + std::to_string(L.dp - 1) + " were found");
      fail(path, "inconsistent world sizes: dp_world_size is " + std::to_string(*dp) + " but " + std::to_string(L.dp) +
                     " ZeRO shards per model-parallel rank were found");
    }
    formats::deepspeed::check_recorded_parallel_sizes(model, path, L.tp, L.pp);
    agreement.model_file(root, path);
    if (mp == 0) {
      m.uc_info = formats::deepspeed::universal_checkpoint_info(model);
      m.num_experts = formats::deepspeed::num_experts(model);
      m.facts = formats::deepspeed::moe_file_facts(root, m.facts.expp_files);
      m.autoep = formats::deepspeed::autoep_layers(model, path);
      // ds_to_universal.py:877: the rank order comes from the model file's ds_config.
      if (!m.autoep.empty()) m.data_before_expert = formats::deepspeed::autoep_data_before_expert(model, path).value_or(false);
    }
    collect_shapes(model, m.shapes[mp]);
  }
  return m;
}

// Native DeepSpeed MoE: every layer_L_expert_E_mp_rank_00 file of every MoE layer L < len(num_experts)
// and expert E < num_experts[L] must be there, and no other (file names only).
void check_native_expert_files(const formats::deepspeed::DeepSpeedLayout& L, const std::vector<int>& num_experts) {
  if (num_experts.empty()) fail(L.model_files[0], "native MoE expert files but the model states have no num_experts");
  auto expert_file = [&](int layer, int e) { return (fs::path(L.dir) / formats::deepspeed::expert_states_name(layer, e, 0)).string(); };
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

// Native MoE expert files (keys and shapes only): each expert parameter's shape into `shapes` of its
// model-parallel rank, its file, and (name with expert index 0) its MoE layer into `experts`.
void read_native_expert_files(const formats::deepspeed::DeepSpeedLayout& L, std::vector<ShapeMap>& shapes, ExpertFacts& experts,
                              const TorchLoadOptions& open) {
  std::map<int, formats::deepspeed::ExpertFileLayer> layers;  // moe_layer_id -> what its files' names say
  for (const auto& ef : L.expert_files) {
    auto& layer = layers[ef.moe_layer];
    if (layer.file.empty()) layer.file = ef.path;
    FileScope scope(ef.path);
    ValuePtr root = load_torch(ef.path, open);
    if (!root || root->kind != Kind::Dict) fail(ef.path, "not an expert state dict");
    for (const auto& [k, v] : root->entries)
      if (v && v->kind == Kind::Tensor) {
        const std::string key = k->as_str();
        shapes.at(ef.mp)[key] = v->tensor->shape();
        experts.expert_file_of[key] = ef.path;
        if (formats::deepspeed::local_expert_index(key)) {
          auto [it, fresh] = experts.moe_layer_of.emplace(formats::deepspeed::with_expert_index(key, 0), ef.moe_layer);
          if (!fresh && it->second != ef.moe_layer)
            fail(ef.path, "expert parameter " + key + " also appears in MoE layer " + std::to_string(it->second) + "'s files");
          if (auto n = formats::deepspeed::transformer_layer_index(key)) layer.named.insert(*n);
          else layer.unnamed = true;
        }
      }
  }
  // The layer an expert is in is its file's moe_layer_id (blocks.N names have no layers.N).
  experts.layer_number = formats::deepspeed::expert_layer_numbers(layers);
}

// What the optimizer shards say about the whole source beside their fragments.
struct ShardFacts {
  int zero_stage = 1;  // BF16_Optimizer shards have no zero_stage
  int ep_seen = 0;     // ep_size of the last expert group seen
};

// The first shard's zero_stage, and (native MoE) the rank order from its ds_config into
// `data_before_expert`.
void read_first_shard_facts(const ShardView& shard, const ValuePtr& root, bool autoep, ShardFacts& facts,
                            bool& data_before_expert) {
  if (const auto& z = shard.shard().zero_stage; z && !z->is_none()) facts.zero_stage = static_cast<int>(z->as_int());
  if (!autoep)
    if (const auto f = formats::deepspeed::shard_data_before_expert(root)) data_before_expert = *f;
}

// Every optimizer shard (model-parallel rank mp, DP rank d) into the plan's files, its param groups'
// fragments through `map`, its partitions and identity into `agreement`.
ShardFacts read_optimizer_shards(const formats::deepspeed::DeepSpeedLayout& L, const ModelFacts& model, bool& data_before_expert,
                                 Zero12FragmentMap& map, ShardAgreement& agreement, ExtractPlan& plan,
                                 const TorchLoadOptions& open) {
  ShardFacts facts;
  for (int mp = 0; mp < L.mp_count(); ++mp) {
    for (int d = 0; d < L.dp; ++d) {
      const std::string& path = L.optim_files[mp][d];
      FileScope scope(path);
      ValuePtr root = load_torch(path, open);
      ShardView shard(root, path);
      agreement.optim_shard(shard, root, path);
      if (d == 0 && mp == 0) read_first_shard_facts(shard, root, !model.autoep.empty(), facts, data_before_expert);
      const int file_index = plan.add_file(path);
      for (int g = 0; g < shard.groups(); ++g) {
        ShardGroup group;
        group.file = file_index;
        group.group = g;
        group.pp_rank = L.pp_rank(mp);
        group.tp_rank = L.tp_rank(mp);
        group.info = shard.group_info(g);
        group.partition = group_partition(group.info, g, d, L.dp, data_before_expert, path);
        if (group.info.moe) facts.ep_seen = group.info.ep_size;
        const GroupPartition& gp = group.partition;
        group.fragments = shard.fragments(g);
        agreement.partition("mp rank " + std::to_string(mp) + ", param group " + std::to_string(g) +
                                (gp.ep_rank >= 0 ? ", EP rank " + std::to_string(gp.ep_rank) : std::string()),
                            gp.part, gp.count, shard.state_tensor(g, "fp32").numel(), group.fragments, path);
        group.states = shard.states(g);
        group.has_step = shard.has_step(g);
        map.add(plan, group, model.shapes[mp], L.model_files[mp], path);
      }
    }
  }
  return facts;
}

// plan.source: the layout and what the files say about it (pipeline numbering read from the layer files).
formats::universal::UniversalSource zero12_source(const formats::deepspeed::DeepSpeedLayout& L, const ExtractPlan& plan,
                                                  const ModelFacts& model, const ShardFacts& shards, bool data_before_expert,
                                                  bool native_moe, const TorchLoadOptions& open) {
  formats::universal::UniversalSource s;
  s.dir = fs::absolute(L.dir).string();
  s.tag = L.tag;
  s.tp = L.tp;
  s.pp = L.pp;
  s.dp = L.dp;
  s.zero_stage = shards.zero_stage;
  s.ep = std::max(L.ep, shards.ep_seen > 0 ? shards.ep_seen : 1);
  s.pipeline = L.pipeline;
  s.bf16 = L.bf16_prefix;
  s.data_before_expert = data_before_expert;
  s.num_experts = model.num_experts;
  s.expert_files = static_cast<int64_t>(L.expert_files.size());
  if (L.pipeline) {
    std::map<int, std::vector<std::string>> keys;
    s.pipeline_numbering = formats::deepspeed::to_json(pipeline_numbering_of(L, plan, keys, open));
    if (!keys.empty()) s.layer_keys = std::move(keys);
  }
  if (L.pipeline && !L.layer_model_axis) s.layer_model_axis = false;  // recorded only when not the usual
  if (native_moe) s.ds_line = formats::deepspeed::detect_moe_version_line(model.facts).name;
  if (!model.autoep.empty()) s.autoep = formats::deepspeed::autoep_layers_json(model.autoep);
  return s;
}

}  // namespace

// ZeRO-1/2 and BF16_Optimizer (ZeRO-3: plan_zero3): model states, expert files, patterns, then the
// optimizer shards' fragments (ucp/fragment_map.h), checked complete.
ExtractPlan plan_checkpoint(const std::string& checkpoint, const ExtractOptions& options) {
  const formats::deepspeed::DeepSpeedLayout L = formats::deepspeed::discover(checkpoint);
  if (L.zero3) return plan_zero3(L, options);
  ExtractPlan plan;
  auto refuse_moe_model_parallel = [&] {
    throw Error(L.dir + ": native DeepSpeed MoE with tp=" + std::to_string(L.tp) + " pp=" + std::to_string(L.pp) +
                " is not supported (only tp=1, pp=1: expert numbering across tensor/pipeline ranks is not handled)");
  };
  if ((!L.expert_files.empty() || !L.expert_optim_files.empty()) && (L.tp > 1 || L.pp > 1 || L.pipeline))
    refuse_moe_model_parallel();
  ShardAgreement agreement;  // every file of one save; every shard's partitions fully described
  ModelFacts model = read_model_facts(L, agreement, options.open);
  ExpertFacts experts;
  experts.num_experts = model.num_experts;
  experts.autoep = model.autoep;
  // AutoEP fused expert weight "<prefix>.w1" -> its layer (index into `autoep`).
  if (!model.autoep.empty()) check_autoep_files(L, model.autoep, model.num_experts, model.shapes[0], experts.autoep_param, options.open);
  const bool native_moe = model.autoep.empty() &&
                          (!L.expert_files.empty() || !L.expert_optim_files.empty() || !model.num_experts.empty());
  if (native_moe && (L.tp > 1 || L.pp > 1 || L.pipeline)) refuse_moe_model_parallel();
  if (native_moe) check_native_expert_files(L, model.num_experts);
  if (model.autoep.empty()) read_native_expert_files(L, model.shapes, experts, options.open);  // AutoEP: check_autoep_files

  const patterns::PatternSet pset = choose_patterns(options, model.uc_info, L, plan);
  bool data_before_expert = model.data_before_expert;
  Zero12FragmentMap map(L.tp, L.pp, pset, experts);
  const ShardFacts shards = read_optimizer_shards(L, model, data_before_expert, map, agreement, plan, options.open);
  agreement.finish();
  check_zero12_coverage(plan, L.tp, L.dir);
  plan.unused_patterns = map.unused_patterns();  // strict: a pattern that matches no parameter
  plan.model_files = L.model_files;
  plan.optimizer_state_file = L.optim_files[0][0];
  plan.source = zero12_source(L, plan, model, shards, data_before_expert, native_moe, options.open);
  return plan;
}


ExtractPlan load_work_plan(const std::string& work_dir) {
  const std::string source = (fs::path(work_dir) / "plan.json").string();
  const nlohmann::json j = parse_json_input(read_text_file(source, "work plan"), source, "corrupt");
  ExtractPlan p;
  try {
    p = ExtractPlan::from_json(j, source);
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

}  // namespace ucpkit::to_universal
