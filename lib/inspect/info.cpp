// ucp-info: describe a checkpoint folder through the tools' own readers (info.h).
#include "inspect/info.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <sstream>

#include "core/error.h"
#include "io/pickle/value.h"
#include "io/shape.h"
#include "inspect/verify_scope.h"
#include "io/torch/torch_file.h"
#include "core/registry.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/module_tree.h"
#include "formats/deepspeed/training_config.h"
#include "formats/deepspeed/version_line.h"
#include "formats/dcp/folder.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/state_keys.h"
#include "formats/hf/folder.h"
#include "formats/hf/import_plan.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "reshard/dcp_output.h"
#include "reshard/direct_source.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"
#include "pec/restore_plan.h"
#include "pec/store.h"
#include "to_universal/extract.h"
#include "to_universal/from_dcp.h"
#include "to_universal/from_torch_dist.h"
#include "to_universal/megatron_core_names.h"
#include "formats/megatron_core/config.h"
#include "to_universal/save.h"
#include "to_universal/shard_reader.h"

namespace fs = std::filesystem;

namespace ucpkit::inspect {

using pickle::Kind;
using pickle::ValuePtr;

const char* status_name(Check::Status status) {
  switch (status) {
    case Check::Status::ok: return "ok";
    case Check::Status::failed: return "failed";
    case Check::Status::skipped: return "skipped";
  }
  return "?";
}

bool CheckpointInfo::ok() const { return first_failure() == nullptr; }

const Check* CheckpointInfo::first_failure() const {
  for (const auto& c : checks)
    if (c.status == Check::Status::failed) return &c;
  return nullptr;
}

namespace {

// Runs one reader's check: its refusal (any exception: the readers throw Error, nlohmann and the
// standard library may throw their own on a damaged file) becomes the check's one-line error.
bool run_check(CheckpointInfo& info, const std::string& name, const std::string& what, const std::function<void()>& f) {
  Check c{name, what, Check::Status::ok, ""};
  try {
    naming_file(f);
  } catch (const std::exception& e) {
    c.status = Check::Status::failed;
    c.error = escaped_brief(e.what(), 600);
  }
  info.checks.push_back(c);
  return c.status == Check::Status::ok;
}

void skip_check(CheckpointInfo& info, const std::string& name, const std::string& what) {
  info.checks.push_back({name, what, Check::Status::skipped, ""});
}

// Every regular file under `dir` (recursively, links not followed), by the kind `classify` gives its
// path relative to `dir`.
void add_sizes(CheckpointInfo& info, const std::string& dir, const std::function<std::string(const std::string&)>& classify) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code e2;
    if (!it->is_regular_file(e2) || it->is_symlink(e2)) continue;
    const uint64_t n = it->file_size(e2);
    if (e2) continue;
    auto& k = info.by_kind[classify(fs::relative(it->path(), dir, e2).generic_string())];
    ++k.files;
    k.bytes += n;
    ++info.files;
    info.bytes += n;
  }
}

std::string deepspeed_file_kind(const std::string& rel) {
  const auto f = formats::deepspeed::parse_file_name(fs::path(rel).filename().string());
  if (!f || rel.find('/') != std::string::npos) return "other";
  switch (f->kind) {
    case formats::deepspeed::FileKind::ModelStates: return "model_states";
    case formats::deepspeed::FileKind::Zero3ModelStates: return "zero3_model_states";
    case formats::deepspeed::FileKind::OptimStates: return "optim_states";
    case formats::deepspeed::FileKind::LayerStates: return "layer_states";
    case formats::deepspeed::FileKind::ExpertStates: return "expert_states";
    case formats::deepspeed::FileKind::ExpertOptim: return "expert_optim_states";
  }
  return "other";
}

// The layout the file names give (before the files are read).
ParallelLayout layout_of(const formats::deepspeed::DeepSpeedLayout& L) {
  ParallelLayout l;
  l.tp = L.tp, l.pp = L.pp, l.dp = L.dp, l.ep = L.ep;
  if (L.zero3) l.zero_stage = 3;
  l.optimizer = L.bf16_prefix && !L.zero3 ? "" : "zero";  // bf16_ files: ZeRO or BF16_Optimizer, told by the shards
  l.pipeline = L.pipeline;
  return l;
}

// dtype names of the tensors of a module state dict ("bfloat16", or "bfloat16,float32" when mixed).
std::string module_dtypes(const ValuePtr& module) {
  std::set<std::string> names;
  for (const auto& [name, v] : formats::deepspeed::module_tensors(module))
    if (v && v->tensor) names.insert(std::string(dtype_name(v->tensor->dtype())));
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

// What the universal form (a universal folder's, or direct mode's in memory) says: layout, step,
// DeepSpeed line, parameters, experts, states, the model files' dtype and DeepSpeed release.
void describe_model(CheckpointInfo& info, const formats::universal::UniversalManifest& manifest, const reshard::ModelInfo& m) {
  ParallelLayout l;
  l.tp = m.source_tp, l.pp = m.source_pp, l.dp = m.source_dp, l.ep = m.source_ep;
  if (m.source_zero_stage > 0) l.zero_stage = m.source_zero_stage;
  l.optimizer = m.source_bf16_optimizer ? "bf16_optimizer" : "zero";
  if (m.source_bf16_optimizer) l.zero_stage.reset();
  l.pipeline = m.pipeline;
  info.layout = l;
  info.tag = m.tag;
  info.step = formats::deepspeed::step_of_tag(m.tag);
  info.ds_line = m.ds_line;
  info.tensors = m.params.size();
  int64_t all = 0, experts = 0;
  for (const auto& p : m.params) {
    const int64_t n = numel_of(p.shape);
    all += n;
    if (p.expert >= 0 || p.autoep_experts > 0) experts += n;
  }
  info.parameters = all;
  info.expert_parameters = experts;
  info.experts_kind = m.native_moe ? "native" : m.autoep ? "autoep" : "";
  if (m.native_moe || m.autoep) info.experts_per_layer = m.num_experts;
  if (m.autoep && info.experts_per_layer.empty()) {  // ZeRO-3 AutoEP records no num_experts: its fused weights say E
    std::map<int, int> by_layer;
    for (const auto& p : m.params)
      if (p.autoep_experts > 0) by_layer[p.moe_id] = p.autoep_experts;
    for (const auto& [layer, e] : by_layer) info.experts_per_layer.push_back(e);
  }
  info.states = m.states;
  for (const auto& p : manifest.params)
    if (p.dtype && !p.dtype->empty()) info.dtypes["optimizer"] = *p.dtype;
  if (!m.model_files.empty()) {
    const ValuePtr first = load_torch(m.model_files[0]);
    if (auto d = module_dtypes(formats::deepspeed::raw_module(first)); !d.empty())
      info.dtypes["model"] = d;
    info.ds_version = formats::deepspeed::ds_version_of(first);
  }
  if (info.ds_version.empty()) info.ds_version = formats::deepspeed::ds_version_of(m.optimizer_state);
  if (info.ds_line.empty() && !info.ds_version.empty())
    info.ds_line = formats::deepspeed::moe_line_of_release(info.ds_version).value_or("");
}

void describe_native(CheckpointInfo& info, const InfoOptions& options) {
  const bool work = info.kind.is(formats::kWorkFolder);
  to_universal::ExtractPlan plan;
  formats::deepspeed::DeepSpeedLayout L;  // stays empty for a work folder
  if (work) {
    info.dir = info.input;
    add_sizes(info, info.dir, [](const std::string& rel) {
      return rel == "plan.json" ? "plan" : rel.rfind("fragments/", 0) == 0 ? "fragments" : "other";
    });
    if (!run_check(info, "plan", "plan.json readable, every file it names inside the folder",
                   [&] { plan = to_universal::load_work_plan(info.input); }))
      return;
  } else {
    if (!run_check(info, "files", "file names: every shard of the layout present exactly once",
                   [&] { L = formats::deepspeed::discover(info.input); })) {
      info.dir = info.input;
      return;
    }
    info.dir = L.dir;
    info.tag = L.tag;
    info.step = formats::deepspeed::step_of_tag(L.tag);
    info.layout = layout_of(L);
    add_sizes(info, info.dir, deepspeed_file_kind);
    const std::string what = std::string("model states, expert files and optimizer shards agree and cover every "
                                         "parameter (ucp-extract / ucp-union's plan)") +
                             (options.verify ? "; zip CRC-32 of every record" : "");
    if (!run_check(info, "plan", what, [&] { plan = to_universal::plan_checkpoint(info.input, {}); })) return;
  }
  run_check(info, "patterns", "every pattern matches a parameter", [&] {
    if (!plan.unused_patterns.empty())
      throw Error("unused pattern '" + plan.unused_patterns[0] + "' (" + plan.patterns_origin +
                  ") matches no parameter (ucp-union refuses it without --allow-unused-patterns)");
  });
  reshard::UniversalMeta meta;
  reshard::ModelInfo m;
  if (!run_check(info, "model_info", "parameter groups, pipeline and expert placement as ucp-load reads them", [&] {
        meta = reshard::direct_meta(plan);
        m = reshard::model_info_from(meta);
      }))
    return;
  describe_model(info, meta.manifest, m);
  // A PipelineModule's weights are in its layer files (the model-states file's module is None).
  if (!info.dtypes.count("model") && !L.layer_files.empty() && !L.layer_files.begin()->second.empty())
    if (auto d = module_dtypes(load_torch(L.layer_files.begin()->second[0])); !d.empty()) info.dtypes["model"] = d;
  if (!plan.params.empty() && !plan.params[0].fragments.empty() && !plan.params[0].fragments[0].empty()) {
    to_universal::SourceCache cache(plan.files);
    info.dtypes["optimizer"] = dtype_name(to_universal::fragment_tensor(cache, plan.params[0].fragments[0][0], "fp32").dtype());
  }
}

// A universal folder ucp-union made from a DCP checkpoint: no DeepSpeed model files, so not what
// ucp-load's model_info reads; its facts come from manifest.json, its checksums from the state files.
void describe_universal_from_dcp(CheckpointInfo& info, const formats::universal::UniversalManifest& manifest,
                                 const InfoOptions& options) {
  skip_check(info, "model_info", to_universal::is_megatron_core_named(manifest.source)
                                    ? "Megatron-Core names (ucp-union --to-names megatron-core): ucp-load reads it with --format torch_dist"
                                    : "made from a DCP checkpoint: no DeepSpeed model files for ucp-load's model_info");
  std::set<std::string> states, dtypes;
  int64_t all = 0;
  for (const auto& p : manifest.params) {
    all += numel_of(p.shape);
    for (const auto& [s, f] : p.states) states.insert(s);
    if (p.dtype) dtypes.insert(*p.dtype);
  }
  info.tensors = manifest.params.size();
  info.parameters = all;
  info.states.assign(states.begin(), states.end());
  std::string d;
  for (const auto& x : dtypes) d += (d.empty() ? "" : ",") + x;
  if (!d.empty()) info.dtypes["model"] = d;
  info.dcp = manifest.source.facts.value("dcp", nlohmann::json(nullptr));
  if (info.dcp.is_object()) {
    info.dcp.erase("keys");  // one path per renamed entry: the layout says it
    info.dcp["items_carried"] = manifest.items.size();
  }
  if (!options.verify) {
    skip_check(info, "checksums", "crc32 of every state file against manifest.json (--no-verify)");
    return;
  }
  run_check(info, "checksums", "crc32 of every state file against manifest.json", [&] {
    for (const auto& b : manifest.buffers) (void)reshard::read_buffer(info.dir, b, true);
    for (const auto& i : manifest.items) (void)reshard::read_item(info.dir, i, true);
    for (const auto& p : manifest.params)
      for (const auto& [s, f] : p.states) {
        const std::string path = (fs::path(info.dir) / f.file).string();
        const uint32_t crc = to_universal::tensor_crc32(formats::universal::read_state_file(load_torch(path), path).param);
        if (f.crc32 && crc != *f.crc32)
          throw Error(path + ": crc32 " + formats::universal::crc32_text(crc) + " differs from manifest.json's " +
                      formats::universal::crc32_text(*f.crc32));
      }
  });
}

void describe_universal(CheckpointInfo& info, const InfoOptions& options) {
  info.dir = info.input;
  formats::universal::UniversalManifest manifest;
  const std::string manifest_path = (fs::path(info.dir) / formats::universal::kUniversalManifestName).string();
  const bool read = run_check(info, "manifest", "manifest.json readable",
                              [&] { manifest = formats::universal::read_universal_manifest(manifest_path); });
  std::set<std::string> model_files(manifest.model_files.begin(), manifest.model_files.end()), state_files;
  for (const auto& p : manifest.params)
    for (const auto& [s, f] : p.states) state_files.insert(f.file);
  std::set<std::string> buffer_files;
  for (const auto& b : manifest.buffers) {
    buffer_files.insert(b.tensor.file);
    if (info.buffers.is_null()) info.buffers = nlohmann::json::array();
    info.buffers.push_back({{"name", b.name}, {"dtype", b.dtype}, {"shape", b.shape}});
  }
  add_sizes(info, info.dir, [&](const std::string& rel) -> std::string {
    if (buffer_files.count(rel)) return "buffer_files";
    if (rel.rfind(std::string(formats::universal::kUniversalItemsFolder) + "/", 0) == 0) return "item_files";
    if (rel == formats::universal::kUniversalManifestName) return "manifest";
    if (rel == manifest.optimizer_state) return "optimizer_state";
    if (model_files.count(rel)) return "model_states";
    if (state_files.count(rel)) return "state_files";
    if (rel.rfind("zero/", 0) == 0 && fs::path(rel).filename() == "step.pt") return "step_files";
    return "other";
  });
  if (!read) return;
  if (manifest.source.format == "dcp" || manifest.source.format == "torch_dist" ||
      to_universal::is_megatron_core_named(manifest.source)) {
    describe_universal_from_dcp(info, manifest, options);
    return;
  }
  reshard::ModelInfo m;
  if (!run_check(info, "model_info", "every file manifest.json names present and consistent (as ucp-load reads them)",
                 [&] { m = reshard::read_model_info(info.dir); }))
    return;
  describe_model(info, manifest, m);
  if (!options.verify) {
    skip_check(info, "checksums", "crc32 of every state file against manifest.json (--no-verify)");
    return;
  }
  run_check(info, "checksums", "crc32 of every state file against manifest.json", [&] {
    reshard::UniversalReader reader(m, info.dir, true);
    for (const auto& b : m.buffers) (void)reshard::read_buffer(info.dir, b, true);
    for (size_t i = 0; i < m.params.size(); ++i)
      for (const auto& s : m.states) reader.check(static_cast<int>(i), s);
  });
}

// The store's committed steps: what each manifest says it saved.
nlohmann::json step_json(const pec::Manifest& m) {
  uint64_t bytes = 0;
  size_t files = 0;
  for (const auto& f : m.non_expert) bytes += f.size, ++files;
  for (const auto& e : m.experts)
    for (const auto& f : e.files) bytes += f.size, ++files;
  return {{"step", m.step},
          {"tag", m.tag},
          {"layout", pec::to_string(m.layout)},
          {"policy", m.policy},
          {"k", m.k},
          {"experts_saved", m.experts.size()},
          {"non_expert_files", m.non_expert.size()},
          {"non_expert_pruned", m.non_expert_pruned},
          {"files", files},
          {"bytes", bytes},
          {"tokens_known", m.tokens_known}};
}

void verify_objects(const pec::Store& store, const std::vector<pec::ManifestCopy>& copies) {
  std::set<std::string> seen;
  auto check = [&](const pec::FileEntry& f) {
    for (const auto& c : f.chunks)
      if (seen.insert(c.object).second) (void)store.objects().get(c.object, c.size);
  };
  for (const auto& copy : copies) {
    for (const auto& f : copy.manifest.non_expert) check(f);
    for (const auto& e : copy.manifest.experts)
      for (const auto& f : e.files) check(f);
  }
}

void describe_store(CheckpointInfo& info, const InfoOptions& options) {
  info.dir = info.input;
  add_sizes(info, info.dir, [](const std::string& rel) {
    return rel.rfind("objects/", 0) == 0 ? "objects" : rel.rfind("manifests/", 0) == 0 ? "manifests" : "other";
  });
  std::unique_ptr<pec::Store> store;
  if (!run_check(info, "store", "a PEC store tier",
                 [&] { store = std::make_unique<pec::Store>(info.dir, pec::Tier::durable, pec::StoreOpen::existing); }))
    return;
  pec::RestoreCatalog catalog;
  catalog.stores.push_back({pec::Tier::durable, info.dir});
  nlohmann::json steps = nlohmann::json::array();
  run_check(info, "manifests", "every committed manifest readable (format, checksum, step)", [&] {
    std::string first_error;
    for (int64_t step : store->committed_steps()) {
      try {
        catalog.copies.push_back({0, store->load_manifest(step)});
        steps.push_back(step_json(catalog.copies.back().manifest));
      } catch (const Error& e) {
        if (first_error.empty()) first_error = e.what();
      }
    }
    if (!first_error.empty()) throw Error(first_error);
  });
  info.store = {{"steps", steps}};
  if (!catalog.copies.empty()) {
    const pec::Manifest& latest = catalog.copies.back().manifest;
    info.tag = latest.tag;
    info.step = latest.step;
    info.experts_per_layer = latest.shape.experts_per_layer;
    info.experts_kind = pec::to_string(latest.layout);
    info.store["layout"] = pec::to_string(latest.layout);
    info.store["ep"] = latest.shape.ep_size;
  }
  run_check(info, "restore", "the newest step restores: its non-expert state and a copy of every expert (pec-restore's plan)",
            [&] {
              const pec::RestorePlan plan = pec::plan_restore(catalog, {-1, info.dir, "", ""});
              info.store["restorable_step"] = plan.step;
            });
  if (!options.verify) {
    skip_check(info, "objects", "every object of every readable manifest present and intact (--no-verify)");
    return;
  }
  run_check(info, "objects", "every object of every readable manifest present and intact (digest)",
            [&] { verify_objects(*store, catalog.copies); });
}

// A DCP or torch_dist folder: its metadata (merged when rank-local), the union plan ucp-union would
// follow, and with --verify every item decoded (in its file, a tensor of its chunk's dtype and shape,
// zip CRC-32 checked).
void describe_dcp(CheckpointInfo& info, const InfoOptions& options) {
  info.dir = info.kind.is(formats::kTorchDist) ? formats::megatron_core::iteration_dir(info.input) : info.input;
  add_sizes(info, info.dir, [](const std::string& rel) -> std::string {
    const std::string name = fs::path(rel).filename().string();
    if (name == ".metadata" || (name.rfind("__", 0) == 0 && fs::path(name).extension() == ".metadata")) return "metadata";
    if (fs::path(name).extension() == ".distcp") return "data";
    return "other";
  });
  formats::dcp::Folder folder;
  formats::dcp::Metadata md;
  if (!run_check(info, "metadata", "DCP metadata readable (every rank's, merged, for a rank-local save)", [&] {
        folder = formats::dcp::find_folder(info.dir);
        md = formats::dcp::read_folder_metadata(folder);
      }))
    return;
  size_t tensors = 0, chunks = 0, bytes_entries = 0, most = 0;
  std::map<std::string, size_t> per_count;
  for (const auto& e : md.entries) {
    if (e.is_bytes) {
      ++bytes_entries;
      continue;
    }
    ++tensors;
    chunks += e.chunks.size();
    most = std::max(most, e.chunks.size());
    ++per_count[std::to_string(e.chunks.size())];
  }
  info.dcp = {{"folder", formats::dcp::folder_kind_name(folder.kind)},
              {"era", formats::dcp::era_name(md.era)},
              {"world_size", formats::dcp::world_size_of(md, folder)},
              {"metadata_files", folder.metadata_files.size()},
              {"entries", md.entries.size()},
              {"tensor_entries", tensors},
              {"bytes_entries", bytes_entries},
              {"items", md.items.size()},
              {"chunks", chunks},
              {"most_chunks", most},
              {"tensors_by_chunk_count", per_count},
              {"version", md.version ? nlohmann::json(*md.version) : nlohmann::json(nullptr)}};
  if (!folder.sharded_backend.empty()) info.dcp["sharded_backend"] = folder.sharded_backend;
  if (folder.kind != formats::dcp::FolderKind::TorchDist) {  // a state dict's keys; torch_dist has Megatron's
    const formats::dcp::KeyLayout keys = formats::dcp::key_layout(md);
    info.dcp["key_layout"] = keys.layout;
    info.dcp["flattened_optimizer"] = keys.flattened_optimizer;
    info.dcp["non_tensor_items"] = keys.non_tensor_items;
    info.dcp["buffers"] = keys.buffers;
  }
  to_universal::DcpPlan plan;
  run_check(info, "plan", "chunks tile every tensor; optimizer states match their parameters (ucp-union's plan)",
            [&] {
              // torch_dist: Megatron-Core's parameters per layer and expert (to_universal/from_torch_dist.h)
              plan = folder.kind == formats::dcp::FolderKind::TorchDist ? to_universal::dcp_plan_of_torch_dist(info.dir)
                                                                        : to_universal::plan_dcp(md, folder);
            });
  if (folder.kind == formats::dcp::FolderKind::TorchDist && plan.source.facts.contains("torch_dist")) {
    // The layout, step and experts Megatron's args and keys record (all null before).
    const nlohmann::json& td = plan.source.facts["torch_dist"];
    info.dcp["megatron_core"] = td;
    ParallelLayout l;
    l.tp = plan.source.tp_or_1(), l.pp = plan.source.pp_or_1(), l.dp = plan.source.dp_or_1();
    l.ep = plan.source.ep_or_1();
    if (td.contains("experts_per_layer") && !td["experts_per_layer"].empty() && td.contains("etp"))
      l.etp = td["etp"].get<int>();
    l.optimizer = "distributed " + td.value("optimizer_format", std::string("none"));
    l.pipeline = l.pp > 1;
    info.layout = l;
    if (td.contains("iteration")) info.step = td["iteration"].get<int64_t>();
    if (plan.source.weights_only.value_or(false)) info.tag = "release";  // Megatron's pretrained-weights folder
    if (td.contains("experts_per_layer") && !td["experts_per_layer"].empty()) {
      std::map<int64_t, int> per_layer;
      for (const auto& [layer, n] : td["experts_per_layer"].items()) per_layer[std::stoll(layer)] = n.get<int>();
      info.experts_kind = "megatron-core";
      for (const auto& [layer, n] : per_layer) info.experts_per_layer.push_back(n);
    }
  }
  std::set<std::string> states, dtypes;
  int64_t elements = 0;
  for (const auto& p : plan.params) {
    for (const auto& [s, fqn] : p.states) states.insert(s);
    if (!p.step.empty()) states.insert("step");
    dtypes.insert(std::string(dtype_name(p.dtype)));
    elements += numel_of(p.shape);
  }
  info.tensors = plan.params.size();
  info.parameters = elements;
  std::vector<std::string> optimizer_states;
  for (const auto& s : states)
    if (s != "fp32") optimizer_states.push_back(s);
  info.states.assign(states.begin(), states.end());
  std::string d;
  for (const auto& x : dtypes) d += (d.empty() ? "" : ",") + x;
  if (!d.empty()) info.dtypes["model"] = d;
  info.dcp["optimizer"] = plan.optimizer;
  info.dcp["optimizer_states"] = optimizer_states;
  std::set<size_t> groups;
  for (const auto& g : plan.param_groups) groups.insert(g.second.first);
  info.dcp["param_groups"] = groups.size();
  info.dcp["items_carried"] = plan.items.size();  // bytes entries ucp-union carries verbatim
  info.dcp["not_carried"] = plan.not_carried;
  if (!options.verify) {
    skip_check(info, "items", "every item decoded: inside its data file, the chunk's dtype and shape (--no-verify)");
    return;
  }
  run_check(info, "items", "every item decoded: inside its data file, the chunk's dtype and shape, zip CRC-32", [&] {
    const formats::dcp::Reader reader(folder.dir, md);
    for (const auto& e : md.entries) {
      if (e.is_bytes) {  // a torch.save of the value
        (void)reader.read_object(e.fqn);
        continue;
      }
      for (size_t k = 0; k < e.chunks.size(); ++k) (void)reader.read_chunk(e.fqn, k);
    }
  });
}

// A Hugging Face model folder: its files read as ucp-union reads them (index and shards checked), the
// family map it takes (config.json against the tensors), the sizes and dtypes; no layout (one set of
// unsharded weights).
void describe_hf(CheckpointInfo& info, const InfoOptions&) {
  info.dir = info.input;
  add_sizes(info, info.dir, [](const std::string& rel) -> std::string {
    if (rel == formats::hf::kConfigFile) return "config";
    if (rel == formats::hf::kIndexFile) return "index";
    if (rel.size() > 12 && rel.compare(rel.size() - 12, 12, ".safetensors") == 0) return "weights";
    return "other";
  });
  std::unique_ptr<formats::hf::Folder> folder;
  if (!run_check(info, "files", "config.json, the index and every shard's header (each tensor once, where the index places it)",
                 [&] { folder = std::make_unique<formats::hf::Folder>(info.dir); })) {
    skip_check(info, "plan", "the family map fits config.json and the tensors (the files did not read)");
    return;
  }
  std::map<std::string, formats::hf::TensorShape> shapes;
  int64_t elements = 0;
  std::set<std::string> dtypes;
  for (const auto& [n, r] : folder->tensors()) {
    shapes[n] = {r.dtype, r.shape};
    elements += numel_of(r.shape);
    dtypes.insert(std::string(dtype_name(r.dtype)));
  }
  info.tensors = folder->tensors().size();
  info.parameters = elements;
  std::string d;
  for (const auto& t : dtypes) d += (d.empty() ? "" : ", ") + t;
  if (!d.empty()) info.dtypes["model"] = d;
  info.hf = {{"architectures", folder->config().value("architectures", nlohmann::json::array())},
             {"model_type", folder->config().value("model_type", std::string())}};
  run_check(info, "plan", "the family map fits config.json and the tensors (as ucp-union converts them)", [&] {
    const auto plan = formats::hf::plan_hf_import(formats::hf::shipped_hf_families(), folder->config(), shapes, info.dir);
    info.hf["family"] = plan.family;
    info.hf["map"] = plan.origin;
    info.hf["megatron_core_parameters"] = plan.params.size();
    info.hf["layers"] = plan.facts["layers"];
    if (plan.facts.value("experts", int64_t{0}) > 0) {
      info.hf["experts"] = {{"count", plan.facts["experts"]}, {"top_k", plan.facts["moe_topk"]}, {"expert_ffn", plan.facts["moe_ffn"]}};
      if (plan.facts.value("shared_ffn", int64_t{0}) > 0) info.hf["experts"]["shared_expert_ffn"] = plan.facts["shared_ffn"];
      info.hf["dense_layers"] = plan.facts["dense_layers"];  // the layers without experts (mlp_only_layers, decoder_sparse_step)
    }
  });
}

}  // namespace

namespace {
// The folder's path ending in its own name: "global_step100/" and "." would give the readers an empty
// or "." tag (they take the tag from the folder's name).
std::string ending_in_its_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename() == "." || p.filename() == "..") p = fs::absolute(p).lexically_normal();
  if (!p.has_filename() && p.has_parent_path() && p.parent_path() != p.root_path()) p = p.parent_path();
  return p.empty() ? path : p.string();
}
NamedTable<Describer>& describers() {
  static NamedTable<Describer> d;
  return d;
}

// The formats of today; a new format registers its describer from its own file.
[[maybe_unused]] const bool kInfoRegistered = register_describer(std::string(formats::kDeepSpeed), describe_native) &&
                                          register_describer(std::string(formats::kWorkFolder), describe_native) &&
                                          register_describer(std::string(formats::kUniversal), describe_universal) &&
                                          register_describer(std::string(formats::kPecStore), describe_store) &&
                                          register_describer(std::string(formats::kDcp), describe_dcp) &&
                                          register_describer(std::string(formats::kTorchDist), describe_dcp) &&
                                          register_describer(std::string(formats::kHf), describe_hf);

}  // namespace

bool register_describer(const std::string& format, Describer describe) { return describers().set(format, std::move(describe)); }

CheckpointInfo describe(const std::string& path, const InfoOptions& options) {
  CheckpointInfo info;
  info.input = ending_in_its_name(path);
  info.kind = formats::detect(info.input);
  VerifyFiles verify(options.verify);
  const Describer describe_kind = describers().find(info.kind.format);
  if (!describe_kind) throw Error(info.input + ": a " + info.kind.name() + " folder, which ucp-info does not describe");
  describe_kind(info, options);
  return info;
}

nlohmann::json CheckpointInfo::to_json() const {
  using nlohmann::json;
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  auto str = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json j = {{"input", input}, {"kind", kind.format}, {"dir", dir}, {"tag", str(tag)}, {"step", opt(step)},
            {"ds_version", str(ds_version)}, {"ds_line", str(ds_line)}};
  j["layout"] = nullptr;
  if (layout)
    j["layout"] = {{"tp", layout->tp}, {"pp", layout->pp}, {"dp", layout->dp}, {"ep", layout->ep},
                   {"zero_stage", opt(layout->zero_stage)}, {"optimizer", str(layout->optimizer)},
                   {"pipeline", layout->pipeline}};
  if (layout && layout->etp) j["layout"]["etp"] = *layout->etp;  // Megatron-Core MoE only
  j["tensors"] = opt(tensors);
  j["parameters"] = opt(parameters);
  j["experts"] = {{"kind", str(experts_kind)},
                  {"moe_layers", experts_per_layer.size()},
                  {"per_layer", experts_per_layer},
                  {"parameters", opt(expert_parameters)}};
  j["dtypes"] = dtypes;
  j["states"] = states;
  json kinds = json::object();
  for (const auto& [k, s] : by_kind) kinds[k] = {{"files", s.files}, {"bytes", s.bytes}};
  j["size"] = {{"bytes", bytes}, {"files", files}, {"by_kind", kinds}};
  if (!store.is_null()) j["store"] = store;
  if (!dcp.is_null()) j["dcp"] = dcp;
  if (!hf.is_null()) j["hf"] = hf;
  if (!buffers.is_null()) j["buffers"] = buffers;
  json cs = json::array();
  for (const auto& c : checks)
    cs.push_back({{"name", c.name}, {"what", c.what}, {"status", status_name(c.status)}, {"error", str(c.error)}});
  j["checks"] = cs;
  j["ok"] = ok();
  return j;
}

namespace {
std::string with_commas(uint64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

std::string human_bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}
}  // namespace

std::string CheckpointInfo::text() const {
  std::ostringstream o;
  auto row = [&](const char* key, const std::string& value) { o << "  " << key << std::string(12 - std::string(key).size(), ' ') << value << "\n"; };
  o << dir << "\n";
  row("kind", kind.format + (tag.empty() ? "" : " (" + tag + ")"));
  if (step) row("step", std::to_string(*step));
  if (layout) {
    std::string l = "TP " + std::to_string(layout->tp) + ", PP " + std::to_string(layout->pp) + ", DP " +
                    std::to_string(layout->dp) + ", EP " + std::to_string(layout->ep);
    if (layout->etp) l += ", ETP " + std::to_string(*layout->etp);
    if (layout->zero_stage) l += ", ZeRO stage " + std::to_string(*layout->zero_stage);
    if (!layout->optimizer.empty())
      l += layout->optimizer == "bf16_optimizer" ? ", BF16_Optimizer"
           : layout->optimizer == "zero"         ? ", ZeRO optimizer"
                                                 : ", " + layout->optimizer + " optimizer";
    if (layout->pipeline) l += ", pipeline layer files";
    row("layout", l);
  }
  if (!ds_version.empty() || !ds_line.empty())
    row("deepspeed", (ds_version.empty() ? std::string("release not recorded") : ds_version) +
                         (ds_line.empty() ? "" : " (version line " + ds_line + ")"));
  if (parameters)
    row("parameters", with_commas(static_cast<uint64_t>(*parameters)) + " in " +
                          with_commas(static_cast<uint64_t>(tensors.value_or(0))) +
                          " tensors" +
                          (expert_parameters && *expert_parameters > 0
                               ? " (" + with_commas(static_cast<uint64_t>(*expert_parameters)) + " in experts)"
                               : ""));
  if (!experts_per_layer.empty()) {
    std::string e = std::to_string(experts_per_layer.size()) + " MoE layers, experts per layer";
    for (size_t i = 0; i < experts_per_layer.size(); ++i) e += (i ? ", " : " ") + std::to_string(experts_per_layer[i]);
    row("experts", e + (experts_kind.empty() ? "" : " (" + experts_kind + ")"));
  }
  if (!dtypes.empty()) {
    std::string d;
    for (const auto& [k, v] : dtypes) d += (d.empty() ? "" : ", ") + k + " " + v;
    row("dtypes", d);
  }
  if (!states.empty()) {
    std::string s;
    for (const auto& x : states) s += (s.empty() ? "" : ", ") + x;
    row("states", s);
  }
  if (hf.is_object()) {
    std::string h = hf.contains("architectures") ? hf["architectures"].dump() : "";
    if (hf.contains("family")) h += "; family " + hf["family"].get<std::string>() + " (" + hf.value("map", "") + ")";
    if (hf.contains("layers")) h += "; " + hf["layers"].dump() + " layers";
    if (hf.contains("experts")) {
      const auto& dense = hf.value("dense_layers", nlohmann::json::array());
      std::string d;
      for (const auto& l : dense) d += (d.empty() ? "" : ", ") + l.dump();
      h += dense.empty() ? ", each MoE: " : ", MoE but layer" + std::string(dense.size() > 1 ? "s " : " ") + d + " (dense): ";
      h += hf["experts"]["count"].dump() + " experts of " + hf["experts"]["expert_ffn"].dump() + ", top " + hf["experts"]["top_k"].dump();
      if (hf["experts"].contains("shared_expert_ffn")) h += ", a shared expert of " + hf["experts"]["shared_expert_ffn"].dump();
    }
    row("hf model", h);
  }
  if (!store.is_null() && store.contains("steps")) {
    std::string s;
    for (const auto& x : store["steps"]) s += (s.empty() ? "" : ", ") + std::to_string(x["step"].get<int64_t>());
    row("saved steps", s.empty() ? "none readable" : s);
  }
  if (buffers.is_array() && !buffers.empty()) {
    std::string b = std::to_string(buffers.size()) + " tensors without optimizer state, each in its own dtype:";
    for (size_t k = 0; k < buffers.size() && k < 6; ++k)
      b += (k ? ", " : " ") + buffers[k]["name"].get<std::string>() + " " + buffers[k]["dtype"].get<std::string>();
    row("buffers", b + (buffers.size() > 6 ? ", ..." : ""));
  }
  if (kind.is(formats::kUniversal) && dcp.is_object())
    row("source", "DCP checkpoint (" + dcp.value("folder", "") + ", " + dcp.value("era", "") + ", world size " +
                      std::to_string(dcp.value("world_size", 0)) +
                      (dcp.contains("layout") ? "; keys as saved: " + dcp.value("layout", "") : std::string()) +
                      (dcp.value("items_carried", 0) ? "; " + std::to_string(dcp.value("items_carried", 0)) +
                                                            " non-tensor items carried" : std::string()) + ")");
  if (!kind.is(formats::kUniversal) && dcp.contains("entries")) {  // a DCP describer's summary of the folder itself
    std::string d = dcp.value("folder", "") + ", " + dcp.value("era", "") + ", world size " +
                    std::to_string(dcp.value("world_size", 0)) + "; " + std::to_string(dcp.value("tensor_entries", 0)) +
                    " tensors in " + std::to_string(dcp.value("chunks", 0)) + " chunks, " +
                    std::to_string(dcp.value("bytes_entries", 0)) + " bytes entries";
    if (dcp.contains("key_layout"))
      d += "; keys: " + dcp["key_layout"].get<std::string>() + (dcp.value("flattened_optimizer", false) ? " (optimizer flattened)" : "");
    row("dcp", d);
    if (dcp.contains("non_tensor_items") && !dcp["non_tensor_items"].empty()) {
      std::string items;
      for (const auto& [head, n] : dcp["non_tensor_items"].items()) items += (items.empty() ? "" : ", ") + head + " " + n.dump();
      row("non-tensor", items);
    }
    if (dcp.contains("buffers") && !dcp["buffers"].empty()) {
      std::string b = std::to_string(dcp["buffers"].size()) + " model tensors without optimizer state:";
      for (size_t k = 0; k < dcp["buffers"].size() && k < 6; ++k) b += (k ? ", " : " ") + dcp["buffers"][k].get<std::string>();
      row("buffers", b + (dcp["buffers"].size() > 6 ? ", ..." : "") +
                         " (ucp-union carries them in their own dtype, without optimizer state)");
    }
    std::string o = "none";
    if (dcp.value("optimizer", false)) {
      o.clear();
      for (const auto& x : dcp["optimizer_states"]) o += (o.empty() ? "" : ", ") + x.get<std::string>();
      const bool flat = dcp.value("flattened_optimizer", false) && dcp.contains("non_tensor_items") &&
                        dcp["non_tensor_items"].contains("param_groups");
      o += flat ? "; param_groups flattened per parameter (" + dcp["non_tensor_items"]["param_groups"].dump() + " items)"
                : "; " + std::to_string(dcp.value("param_groups", 0)) + " param_groups";
    }
    row("optimizer", o);
  }
  std::string size = human_bytes(bytes) + " in " + with_commas(static_cast<uint64_t>(files)) + " files";
  for (const auto& [k, s] : by_kind) size += "; " + k + " " + human_bytes(s.bytes) + " (" + std::to_string(s.files) + ")";
  row("size", size);
  for (const auto& c : checks)
    row("check", c.name + ": " + status_name(c.status) + (c.error.empty() ? "" : " - " + c.error));
  return o.str();
}

}  // namespace ucpkit::inspect
