// DeepSpeed native-MoE version lines (deepspeed-moe-format.md section 8). Each entry cites the
// DeepSpeed save code (repository deepspeedai/DeepSpeed, file:line at the named tag).
#include "formats/deepspeed/version_line.h"

#include <algorithm>

#include "core/error.h"
#include "formats/deepspeed/module_tree.h"

namespace ucpkit::formats::deepspeed {
namespace {

std::vector<std::string> keys_before_0_19_3(bool autoep) {
  // engine.py `state = {...}` of _save_moe_checkpoint: v0.16.5 :3428-3451, v0.19.2 :4377-4402.
  std::vector<std::string> k = {"module",        "lr_scheduler",   "data_sampler",  "random_ltd",
                                "sparse_tensor_module_names",      "skipped_steps", "global_steps",
                                "global_samples", "dp_world_size", "mp_world_size", "num_experts"};
  if (autoep) k.push_back("ds_autoep_layers");
  return k;
}

std::vector<std::string> keys_common_state(bool parallel_dims) {
  // v0.19.3 engine.py:4705-4726 (_common_checkpoint_state) then :4989-4990; v0.19.5 :4840-4862 adds
  // checkpoint_parallel_dimensions after mp_world_size (_checkpoint_parallel_metadata, :238-246).
  std::vector<std::string> k = {"module",         "buffer_names",  "optimizer",     "param_shapes",   "frozen_param_shapes",
                                "shared_params",  "frozen_param_fragments",         "lr_scheduler",   "data_sampler",
                                "random_ltd",     "sparse_tensor_module_names",     "skipped_steps",  "global_steps",
                                "global_samples", "dp_world_size", "mp_world_size"};
  if (parallel_dims) k.push_back(kCheckpointParallelDims);
  for (const char* x : {"ds_config", "ds_version", "num_experts", "ds_autoep_layers"}) k.push_back(x);
  return k;
}

std::vector<int> parse_version(std::string_view v) {
  if (!v.empty() && (v[0] == 'v' || v[0] == 'V')) v.remove_prefix(1);
  std::vector<int> out;
  int cur = -1;
  for (char c : v) {
    if (c >= '0' && c <= '9') {
      cur = (cur < 0 ? 0 : cur * 10) + (c - '0');
    } else if (c == '.' && cur >= 0) {
      out.push_back(cur);
      cur = -1;
    } else {
      break;  // "0.16.5+abc", "0.19.0rc1": the numeric prefix decides
    }
  }
  if (cur >= 0) out.push_back(cur);
  while (out.size() < 3 && !out.empty()) out.push_back(0);
  return out;
}

}  // namespace

bool is_deepspeed_model_key(std::string_view key) {
  static const std::vector<std::string> keys = keys_common_state(true);
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

const std::vector<VersionLine>& moe_version_lines() {
  static const std::vector<VersionLine> lines = {
      {"0.14", "v0.14.0 - v0.17.0", "0.16.5",
       "v0.16.5 deepspeed/runtime/engine.py:3346-3453 (_save_moe_checkpoint; tensors saved as they are)",
       /*module_metadata=*/true, /*compact_copies=*/false, /*common_state=*/false, /*autoep_key=*/false,
       /*expp_files=*/true, keys_before_0_19_3(false)},
      {"0.17.1", "v0.17.1 - v0.19.1", "0.17.1",
       "v0.17.1 deepspeed/runtime/engine.py:3483,3505,3545 (clone_tensors_for_torch_save, "
       "deepspeed/checkpoint/utils.py:41-65: type(d)({...}) drops _metadata)",
       false, true, false, false, true, keys_before_0_19_3(false)},
      {"0.19.2", "v0.19.2", "0.19.2", "v0.19.2 deepspeed/runtime/engine.py:4377-4414 ('ds_autoep_layers' :4401)",
       false, true, false, true, true, keys_before_0_19_3(true)},
      {"0.19.3", "v0.19.3 - v0.19.4", "0.19.3",
       "v0.19.3 deepspeed/runtime/engine.py:4705-4726 (_common_checkpoint_state), :4988-4990, expp :4933-4949",
       false, true, true, true, true, keys_common_state(false)},
      {"0.19.5", "v0.19.5 -", "0.19.5",
       "v0.19.5 deepspeed/runtime/engine.py:5066-5087 (expp file only without ZeRO), :5124-5126, "
       "checkpoint_parallel_dimensions :238-246 via :4840-4862",
       false, true, true, true, false, keys_common_state(true)},
  };
  return lines;
}

std::optional<std::string> moe_line_of_release(std::string_view version) {
  const auto v = parse_version(version);
  if (v.size() < 2 || v[0] != 0 || v[1] < 14) return std::nullopt;
  const VersionLine* best = nullptr;
  for (const auto& line : moe_version_lines())
    if (parse_version(line.name) <= v) best = &line;
  if (!best) return std::nullopt;
  return best->name;
}

const VersionLine& moe_version_line(std::string_view name) {
  const auto& lines = moe_version_lines();
  for (const auto& line : lines)
    if (line.name == name) return line;
  if (auto l = moe_line_of_release(name))
    for (const auto& line : lines)
      if (line.name == *l) return line;
  throw UsageError("unknown DeepSpeed version line '" + std::string(name) + "': one of " + moe_version_line_list());
}

std::string moe_version_line_list() {
  std::string s;
  for (const auto& line : moe_version_lines()) s += (s.empty() ? "" : ", ") + line.name + " (" + line.range + ")";
  return s;
}

MoeFileFacts moe_file_facts(const pickle::ValuePtr& root, bool expp_files) {
  MoeFileFacts f;
  f.expp_files = expp_files;
  if (!root || root->kind != pickle::Kind::Dict) return f;
  f.param_shapes = root->contains("param_shapes");
  f.autoep_key = root->contains("ds_autoep_layers");
  f.parallel_dims = root->contains(kCheckpointParallelDims);
  f.module_metadata = module_has_metadata(root->get("module"));
  if (auto v = root->get("ds_version"); v && v->kind == pickle::Kind::Str) f.ds_version = v->s;
  return f;
}

const VersionLine& detect_moe_version_line(const MoeFileFacts& f) {
  if (!f.ds_version.empty())
    if (auto l = moe_line_of_release(f.ds_version)) {
      const VersionLine& line = moe_version_line(*l);
      // ds_version is only written from 0.19.3 on; an older release string there wins only when
      // the keys agree with it.
      if (line.common_state == f.param_shapes) return line;
    }
  if (f.param_shapes) return moe_version_line(f.expp_files && !f.parallel_dims ? "0.19.3" : "0.19.5");
  if (f.autoep_key) return moe_version_line("0.19.2");
  return moe_version_line(f.module_metadata ? "0.14" : "0.17.1");
}

const VersionLine& resolve_moe_line(const std::string& requested, const std::string& recorded,
                                    const pickle::ValuePtr& template_root) {
  if (!requested.empty()) return moe_version_line(requested);
  if (!recorded.empty()) return moe_version_line(recorded);
  // expp files not recorded: the older universal checkpoints came from lines with expp files
  return detect_moe_version_line(moe_file_facts(template_root, true));
}

}  // namespace ucpkit::formats::deepspeed
