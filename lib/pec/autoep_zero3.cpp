// Expert byte ranges of DeepSpeed AutoEP under ZeRO-3 (docs/pec.md "AutoEP under ZeRO-3").
#include "pec/autoep_zero3.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "io/zip/zip_directory.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/autoep_slices.h"
#include "formats/deepspeed/autoep_zero3_ranks.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/deepspeed/save_identity.h"
#include "formats/deepspeed/zero_partition.h"
#include "io/shape.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {

bool is_autoep_zero3(const std::string& zero3_model_file) {
  const pickle::ValuePtr root = load_torch(zero3_model_file);
  if (!root || !root->is(pickle::Kind::Dict)) return false;
  return formats::deepspeed::has_autoep_layers(formats::deepspeed::read_model_states(root, zero3_model_file));
}

namespace {

// One DP rank's files as the expert ranges need them: the model file's ds_autoep_layers and
// param_shapes (the sub-groups' parameters in partition order), the optimizer shard and its zip records.
struct RankFiles {
  std::vector<formats::deepspeed::AutoEpLayer> layers;
  std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>> sub_groups;
  TorchFile tf;
  formats::deepspeed::OptimizerShard shard;
  std::map<std::string, ZipRecord> records;
  std::string prefix;
  formats::deepspeed::IdentityFields model_identity, optim_identity;  // what every file of one save repeats
};

RankFiles read_rank(const std::string& model_path, const std::string& optim_path) {
  RankFiles r;
  const pickle::ValuePtr root = load_torch(model_path);
  if (!root || !root->is(pickle::Kind::Dict)) fail(model_path, "no ds_autoep_layers (not an AutoEP ZeRO-3 save)");
  const formats::deepspeed::ModelStates model = formats::deepspeed::read_rank_model_states(root, model_path);
  if (!formats::deepspeed::has_autoep_layers(model)) fail(model_path, "no ds_autoep_layers (not an AutoEP ZeRO-3 save)");
  r.model_identity = formats::deepspeed::model_file_identity(root);
  r.layers = formats::deepspeed::autoep_layers(model, model_path);
  formats::deepspeed::check_autoep_zero3_layers(r.layers, model_path);
  const auto ps = formats::deepspeed::saved_param_shapes(model);
  if (!ps || ps->one_dict) fail(model_path, "ZeRO-3 model states have no param_shapes list");
  if (ps->not_dicts) fail(model_path, "param_shapes entry is not a dict");
  r.sub_groups = ps->groups;
  auto mapped = MappedFile::open(optim_path);
  if (!looks_like_zip(mapped->bytes())) fail(optim_path, "legacy (non-zip) optimizer files are not supported by pec-save");
  r.records = read_zip_directory(mapped->bytes(), optim_path);
  r.tf = load_torch_file(optim_path);
  r.prefix = r.tf.archive_prefix.empty() ? std::string() : r.tf.archive_prefix + "/";
  r.optim_identity = formats::deepspeed::optim_file_identity(r.tf.root);
  r.shard = formats::deepspeed::read_optimizer_shard(r.tf);
  for (const auto& g : r.shard.groups)  // the training step every sub-group's state repeats
    if (g.step) {
      r.optim_identity.emplace_back("optimizer step", formats::deepspeed::identity_text(g.step));
      break;
    }
  if (!r.shard.zero3()) fail(optim_path, "ZeRO-3 model files but this optimizer shard is not ZeRO-3");
  if (r.shard.partition_groups.size() != r.sub_groups.size())
    fail(optim_path, "ZeRO-3 shard: ds_zero_partition_groups lists " + std::to_string(r.shard.partition_groups.size()) +
                         " sub-groups but param_shapes lists " + std::to_string(r.sub_groups.size()));
  return r;
}

// Every rank's files repeat rank 0's identity fields (formats/deepspeed/save_identity.h): files of
// another save mixed into the folder are refused, as ucp-union's shard agreement refuses them.
void check_same_save(const std::vector<RankFiles>& ranks, const std::vector<std::string>& model_files,
                     const std::vector<std::string>& optim_files) {
  auto compare = [](const formats::deepspeed::IdentityFields& first, const formats::deepspeed::IdentityFields& other,
                    const std::string& first_path, const std::string& path) {
    std::map<std::string, std::string> want(first.begin(), first.end());
    for (const auto& [field, value] : other)
      if (auto it = want.find(field); it != want.end() && it->second != value)
        fail(path, field + " is " + value + " but " + first_path + " says " + it->second +
                       ": files of different saves (another step or checkpoint) or a damaged shard are mixed");
  };
  for (size_t d = 1; d < ranks.size(); ++d) {
    compare(ranks[0].model_identity, ranks[d].model_identity, model_files[0], model_files[d]);
    compare(ranks[0].optim_identity, ranks[d].optim_identity, optim_files[0], optim_files[d]);
  }
}

// The tensors of sub-group g whose elements follow its partition layout: fp32, then every 1-D state.
std::vector<const Tensor*> partition_tensors(const formats::deepspeed::OptimizerShard::Group& g) {
  std::vector<std::pair<std::string, const Tensor*>> moments;
  for (const auto& [name, t] : g.moments)
    if (t.dim() == 1) moments.emplace_back(name, &t);
  std::sort(moments.begin(), moments.end());
  std::vector<const Tensor*> out{&g.fp32};
  for (const auto& m : moments) out.push_back(m.second);
  return out;
}

}  // namespace

AutoEpZero3Experts autoep_zero3_experts(const std::string& step_dir) {
  const formats::deepspeed::DeepSpeedLayout L = formats::deepspeed::discover(step_dir);
  if (!L.zero3) fail(step_dir, "not a ZeRO-3 checkpoint (no zero_pp_rank_D model files)");
  if (L.tp != 1 || L.pp != 1)
    fail(L.zero3_model_files.at(0).at(0), "DeepSpeed AutoEP under ZeRO-3 with tp=" + std::to_string(L.tp) +
                                              ": DeepSpeed refuses AutoEP with AutoTP under ZeRO-3 (engine.py:1850-1853)");
  std::vector<RankFiles> ranks;
  std::vector<std::vector<formats::deepspeed::AutoEpLayer>> layers_of_rank;
  for (int d = 0; d < L.dp; ++d) {
    ranks.push_back(read_rank(L.zero3_model_files[0][d], L.optim_files[0][d]));
    layers_of_rank.push_back(ranks.back().layers);
  }
  check_same_save(ranks, L.zero3_model_files[0], L.optim_files[0]);
  formats::deepspeed::check_autoep_ranks_agree(layers_of_rank, L.zero3_model_files[0], L.dp);
  std::map<std::string, size_t> layer_of_weight;  // "<prefix>.w1" -> index into a rank's layers
  for (size_t i = 0; i < ranks[0].layers.size(); ++i)
    for (const auto& w : formats::deepspeed::autoep_weight_names())
      layer_of_weight[ranks[0].layers[i].expert_key_prefix + "." + w] = i;
  AutoEpZero3Experts out;
  out.ep_size = ranks[0].layers.empty() ? 1 : ranks[0].layers[0].ep_size;
  if (out.ep_size < 1 || L.dp % out.ep_size) fail(step_dir, "AutoEP EP size does not divide the DP size");
  std::map<int, int> experts_of_layer;
  // Each fused weight's partitions (part = ep_rank * count + partition_rank, the join order of
  // ds_to_universal.py:654-707): each claimed once, together all E experts' elements.
  std::map<std::string, std::map<int, int64_t>> parts_of_weight;
  std::map<std::string, int64_t> local_numel;
  for (int d = 0; d < L.dp; ++d) {
    RankFiles& r = ranks[static_cast<size_t>(d)];
    const std::string& path = L.optim_files[0][d];
    const std::string rel = fs::path(path).filename().string();
    for (size_t g = 0; g < r.sub_groups.size(); ++g) {
      const auto& pg = r.shard.partition_groups[g];
      const auto tensors = partition_tensors(r.shard.groups.at(g));
      int64_t offset = 0;  // a rank's partition of a sub-group: its slice of every parameter, in order
      for (const auto& [name, shape] : r.sub_groups[g]) {
        const int64_t n = numel_of(shape), per = formats::deepspeed::zero3_slice_numel(n, pg.partition_count);
        const int64_t have = std::max<int64_t>(0, std::min(per, n - pg.partition_rank * per));
        auto w = layer_of_weight.find(name);
        if ((w != layer_of_weight.end()) != pg.autoep_expert)
          fail(path, "sub-group " + std::to_string(g) +
                         (pg.autoep_expert ? " is an AutoEP expert sub-group but holds " : " is a dense sub-group but holds AutoEP expert weight ") + name);
        if (w != layer_of_weight.end() && have > 0) {
          const auto& a = r.layers[w->second];
          if (pg.partition_count != a.expert_data_parallel_world_size || pg.partition_rank != a.expert_data_parallel_rank)
            fail(path, "sub-group " + std::to_string(g) + " is partition " + std::to_string(pg.partition_rank) + " of " +
                           std::to_string(pg.partition_count) + " but " + L.zero3_model_files[0][d] +
                           " records expert-DP rank " + std::to_string(a.expert_data_parallel_rank) + " of " +
                           std::to_string(a.expert_data_parallel_world_size));
          const int part = a.ep_rank * pg.partition_count + pg.partition_rank;
          if (!parts_of_weight[name].emplace(part, have).second)
            fail(path, "parameter " + name + " partition " + std::to_string(part) +
                           " is also in another shard (two ranks claim the same EP rank and expert-DP rank)");
          experts_of_layer[a.moe_layer_id] = a.num_experts;
          local_numel[name] = n;
          for (const auto& run : formats::deepspeed::autoep_zero3_fragment_runs(shape, pg.partition_count, part, have, path, name))
            add_element_ranges(tensors, r.records, r.prefix, offset + run.offset, run.numel, path, name,
                               out.ranges[rel][{a.moe_layer_id, run.global_expert}]);
        }
        offset += per;
      }
    }
  }
  if (experts_of_layer.empty()) fail(step_dir, "no AutoEP expert weights in the ZeRO-3 shards");
  for (const auto& [name, parts] : parts_of_weight) {
    int64_t have = 0;
    for (const auto& [part, n] : parts) have += n;
    const int64_t full = local_numel.at(name) * out.ep_size;  // [E, ...] = every EP rank's [E_local, ...]
    if (have != full)
      fail(step_dir, "parameter " + name + ": ZeRO-3 slices hold " + std::to_string(have) + " of " +
                         std::to_string(full) + " elements");
  }
  int expect = 0;
  for (const auto& [layer, e] : experts_of_layer) {
    if (layer != expect++) fail(step_dir, "AutoEP moe_layer_id " + std::to_string(expect - 1) + " has no expert weights");
    out.experts_per_layer.push_back(e);
  }
  return out;
}

}  // namespace ucpkit::pec
