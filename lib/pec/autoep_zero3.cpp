// Expert byte ranges of DeepSpeed AutoEP under ZeRO-3 (docs/pec.md "AutoEP under ZeRO-3").
#include "pec/autoep_zero3.h"

#include <filesystem>
#include <memory>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/torch/torch_file.h"
#include "io/zip/zip_directory.h"
#include "formats/deepspeed/autoep_slices.h"
#include "to_universal/extract.h"
#include "to_universal/shard_reader.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {

bool is_autoep_zero3(const std::string& zero3_model_file) {
  pickle::ValuePtr root = load_torch(zero3_model_file);
  pickle::ValuePtr layers = root && root->is(pickle::Kind::Dict) ? root->get("ds_autoep_layers") : nullptr;
  return layers && !layers->is_none();
}

AutoEpZero3Experts autoep_zero3_experts(const std::string& step_dir) {
  // The extract plan validates the layout as ucp-union does (every rank's ds_autoep_layers,
  // ds_zero_partition_groups against them, complete slices) and lists each AutoEP weight's fragments
  // per shard in join order (part = ep_rank * DP/EP + partition_rank).
  const to_universal::ExtractPlan plan = to_universal::plan_checkpoint(step_dir, {});
  AutoEpZero3Experts out;
  out.ep_size = plan.source.value("ep", 1);
  const int dp = plan.source.value("dp", 1);
  if (out.ep_size < 1 || dp % out.ep_size) fail(step_dir, "AutoEP EP size does not divide the DP size");
  const int count = dp / out.ep_size;  // the expert-DP group (docs/formats.md "AutoEP under ZeRO-3")

  struct Shard {
    TorchFile tf;
    std::map<std::string, ZipRecord> records;
    std::string prefix;
  };
  std::vector<std::unique_ptr<Shard>> shards(plan.files.size());
  auto shard = [&](int f) -> Shard& {
    if (!shards[f]) {
      const std::string& path = plan.files[f];
      auto s = std::make_unique<Shard>();
      auto mapped = MappedFile::open(path);
      if (!looks_like_zip(mapped->bytes())) fail(path, "legacy (non-zip) optimizer files are not supported by pec-save");
      s->records = read_zip_directory(mapped->bytes(), path);
      s->tf = load_torch_file(path);
      s->prefix = s->tf.archive_prefix.empty() ? std::string() : s->tf.archive_prefix + "/";
      shards[f] = std::move(s);
    }
    return *shards[f];
  };

  std::map<int, int> experts_of_layer;
  for (const auto& p : plan.params) {
    if (p.autoep_experts <= 0) continue;
    if (p.fragments.size() != 1 || p.tp_shapes.empty() || p.tp_shapes[0].empty())
      fail(step_dir, "AutoEP expert weight " + p.name + " with tensor parallelism");
    if (p.autoep_experts % out.ep_size) fail(step_dir, "AutoEP expert weight " + p.name + ": EP size does not divide E");
    experts_of_layer[p.moe_layer] = p.autoep_experts;
    std::vector<int64_t> local = p.tp_shapes[0];  // [E, ...] -> this EP rank's [E_local, ...]
    local[0] = p.autoep_experts / out.ep_size;
    for (const auto& f : p.fragments[0]) {
      Shard& s = shard(f.file);
      const std::string& path = plan.files[f.file];
      const to_universal::ShardView view(s.tf.root, path);
      std::vector<Tensor> tensors;  // every state of the sub-group follows its partition layout
      for (const auto& state : p.states) tensors.push_back(view.state_tensor(f.group, state));
      std::vector<const Tensor*> ptrs;
      for (const auto& t : tensors) ptrs.push_back(&t);
      const std::string rel = fs::path(path).filename().string();
      for (const auto& run : formats::deepspeed::autoep_zero3_fragment_runs(local, count, f.part, f.numel, path, p.name))
        add_element_ranges(ptrs, s.records, s.prefix, f.offset + run.offset, run.numel, path, p.name,
                           out.ranges[rel][{p.moe_layer, run.global_expert}]);
    }
  }
  if (experts_of_layer.empty()) fail(step_dir, "no AutoEP expert weights in the ZeRO-3 shards");
  int expect = 0;
  for (const auto& [layer, e] : experts_of_layer) {
    if (layer != expect++) fail(step_dir, "AutoEP moe_layer_id " + std::to_string(expect - 1) + " has no expert weights");
    out.experts_per_layer.push_back(e);
  }
  return out;
}

}  // namespace ucpkit::pec
