// ucp-union --to-names: a universal folder rewritten into Megatron-Core or Megatron-DeepSpeed names.
// Read the manifest -> plan every parameter's new name and layout (plain data) -> rewrite the state
// files one parameter a task into a staging folder -> write the manifest -> commit.
#include "to_universal/megatron_core_names.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include <unistd.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/staging.h"
#include "formats/detect.h"
#include "formats/deepspeed/pipeline.h"
#include "formats/deepspeed/training_config.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/deepspeed_common_state.h"
#include "formats/megatron_core/deepspeed_map.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "parallel/threads.h"
#include "patterns/pattern_set.h"
#include "to_universal/from_torch_dist.h"
#include "to_universal/hf_megatron_deepspeed.h"
#include "to_universal/plan.h"
#include "to_universal/save.h"

namespace ucpkit::to_universal {

namespace fs = std::filesystem;
namespace mc = formats::megatron_core;
namespace uv = formats::universal;
using nlohmann::json;

namespace {

// manifest.json source keys of a Megatron-Core-named folder made here (ucpkit's own keys).
constexpr const char* kRecordKey = "megatron_core_names";
constexpr const char* kModelFilesDir = "megatron_deepspeed";

// A fused QKV joined by a sub-params pattern is [Q; K; V] whole (the sub-params join concatenates each
// sub-parameter over TP ranks); joined by concatenation it is already in Megatron's per-group order
// (docs/megatron-core-mapping.md, "QKV").
bool joined_as_sub_params(const uv::UniversalParam& p) {
  const std::string join = p.join.value_or("");
  const std::string kind = patterns::join_kind_name(patterns::JoinKind::SubParams);
  return join.rfind(kind, 0) == 0 && (join.size() == kind.size() || join[kind.size()] == '+');
}

struct Job {
  size_t from = 0;           // index in the input manifest's params
  std::string name;          // the output name
  mc::MapLayout layout = mc::MapLayout::Identity;
  bool regroup_qkv = false;  // [Q; K; V] <-> per-group rows
  int64_t pad_rows = 0;      // vocabulary rows to Megatron's padded size (zeros; cut on the way back)
  uv::UniversalParam out;    // the output entry (states' crc32 filled when written)
};

mc::PipeNumbering pipe_numbering(const uv::UniversalManifest& m, const std::string& file) {
  mc::PipeNumbering pn;
  const auto& src = m.source;
  if (!src.pipeline.value_or(false) || src.pipeline_numbering.is_null()) return pn;
  const auto n = formats::deepspeed::pipeline_numbering_from_json(src.pipeline_numbering, file + ": source.pipeline_numbering");
  pn.first_block = n.first_block;
  pn.final_norm = n.final_norm;
  // An untied head is GPTModelPipe's LMHeadPipe spec right after the final norm (docs/megatron-core-mapping.md).
  pn.head = n.tied_head >= 0 ? n.tied_head : (n.final_norm >= 0 ? n.final_norm + 1 : -1);
  return pn;
}

// The map every parameter maps under: `file`, else the shipped family that maps them all with the
// fewest rules left unused (the most specific one).
mc::ModelMap choose_map(const std::vector<std::string>& names, const mc::PipeNumbering& pn, const std::string& file,
                        const std::string& manifest) {
  std::vector<mc::ModelMap> maps;
  if (!file.empty()) maps.push_back(mc::read_model_map(file));
  else maps = mc::shipped_model_maps();
  const mc::ModelMap* best = nullptr;
  size_t best_unused = 0;
  std::string first_unmapped;
  for (const auto& map : maps) {
    std::vector<bool> used(map.rules.size(), false);
    bool all = true;
    for (const auto& n : names) {
      const auto m = mc::to_megatron_core(map, n, pn);
      if (!m) {
        if (first_unmapped.empty() || !file.empty()) first_unmapped = n;
        all = false;
        break;
      }
      used[m->rule] = true;
    }
    if (!all) continue;
    const size_t unused = static_cast<size_t>(std::count(used.begin(), used.end(), false));
    if (!best || unused < best_unused) best = &map, best_unused = unused;
  }
  if (!best) {
    if (!file.empty())
      throw Error(file + ": no rule maps parameter '" + escaped_brief(first_unmapped) + "' of " + manifest);
    throw Error(manifest + ": no shipped Megatron-Core map (patterns/megatron-core/*.json) names every parameter; "
                "the first one left: '" + escaped_brief(first_unmapped) + "' (give --model-map FILE)");
  }
  return *best;
}

// Query heads and groups from the first model file's Megatron args.
mc::QkvShape qkv_shape(const std::string& model_file, int64_t rows) {
  const auto sizes = formats::deepspeed::megatron_sizes(load_torch(model_file));
  if (sizes.heads <= 0)
    throw Error(model_file + ": Megatron args give no num_attention_heads; the fused QKV rows cannot be regrouped");
  mc::QkvShape s;
  s.heads = sizes.heads;
  s.groups = sizes.kv_heads > 0 ? sizes.kv_heads : sizes.heads;
  if ((s.heads + 2 * s.groups) <= 0 || rows % (s.heads + 2 * s.groups) != 0)
    throw Error(model_file + ": " + std::to_string(rows) + " QKV rows do not split into " + std::to_string(s.heads) +
                " query heads and 2 x " + std::to_string(s.groups) + " key/value heads");
  s.head_dim = rows / (s.heads + 2 * s.groups);
  return s;
}

json qkv_json(const mc::QkvShape& s) { return {{"heads", s.heads}, {"groups", s.groups}, {"head_dim", s.head_dim}}; }

mc::QkvShape qkv_from_json(const json& j, const std::string& file) {
  if (!j.is_object() || !j.contains("heads") || !j.contains("groups") || !j.contains("head_dim"))
    throw Error(file + ": source." + std::string(kRecordKey) + ".qkv needs heads, groups and head_dim");
  return {j["heads"].get<int64_t>(), j["groups"].get<int64_t>(), j["head_dim"].get<int64_t>()};
}

struct Counters {
  std::atomic<uint64_t> read{0}, written{0}, files{0};
};

void copy_counted(const std::string& from, const std::string& to, Counters& c) {
  copy_file_contents(from, to);
  const uint64_t n = fs::file_size(to);
  c.read += n;
  c.written += n;
  ++c.files;
}

// The files of a parameter folder besides its state files (step.pt), copied as they are.
size_t copy_other_files(const fs::path& from_dir, const fs::path& to_dir, const std::set<std::string>& state_files,
                        Counters& c) {
  size_t n = 0;
  if (!fs::is_directory(from_dir)) return n;
  for (const auto& e : fs::directory_iterator(from_dir)) {
    if (!e.is_regular_file() || state_files.count(e.path().filename().string())) continue;
    copy_counted(e.path().string(), (to_dir / e.path().filename()).string(), c);
    ++n;
  }
  return n;
}

Tensor read_param(const fs::path& root, const std::string& rel, Counters& c) {
  const std::string path = (root / rel).string();
  const auto f = uv::read_state_file(load_torch(path), path);
  if (f.bare) throw Error(path + ": a bare 1-D state (ZeRO-3 TP = 1 form) has no layout to rename; convert it with "
                          "ucp-load to TP >= 1 ZeRO-1 first");
  c.read += fs::file_size(path);
  return f.param.contiguous();
}

// Runs `jobs` one parameter a task on `threads` threads.
void run_jobs(std::vector<Job>& jobs, int threads, const Reporter& reporter, const std::function<void(Job&)>& f) {
  std::vector<size_t> all(jobs.size());
  std::iota(all.begin(), all.end(), size_t{0});
  Reporter::Bar progress(reporter, "ucp-union", jobs.size());
  convert_each(all, threads, progress, [&](size_t i) { f(jobs[i]); });
  progress.finish();
}

RunSummary summary(const std::string& output, size_t params, int threads, const Counters& c,
                   std::chrono::steady_clock::time_point t0) {
  RunSummary s;
  s.tool = "ucp-union";
  s.output = output;
  s.params = params;
  s.threads = threads;
  s.bytes_read = c.read;
  s.bytes_written = c.written;
  s.files_written = c.files;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

void write_manifest(const uv::UniversalManifest& m, const fs::path& staged, Counters& c) {
  const std::string path = (staged / uv::kUniversalManifestName).string();
  write_file_atomic(path, m.text());
  c.written += fs::file_size(path);
  ++c.files;
}

// Everything the rename of a Megatron-DeepSpeed-named folder decides before writing (also the record a
// --template gives the way back).
struct ForwardPlan {
  uv::UniversalManifest m;
  std::string mfile;
  std::vector<Job> jobs;
  std::optional<mc::QkvShape> qkv;
  json record;
  pickle::ValuePtr model_states;  // the first model file's root (null when the folder has none)
  std::string model_file;
};

// `model_file`: the resolved path of the manifest's first model file ("" when it lists none).
ForwardPlan plan_forward(uv::UniversalManifest manifest, const std::string& manifest_file, const std::string& model_file,
                         const std::string& map_file, std::string* family) {
  ForwardPlan f;
  f.mfile = manifest_file;
  f.m = std::move(manifest);
  const uv::UniversalManifest& m = f.m;
  const std::string& mfile = f.mfile;
  if (is_megatron_core_named(m.source) || m.source.format == "torch_dist")
    throw Error(mfile + ": this universal folder already has Megatron-Core names");
  const auto& src = m.source;
  if (!src.autoep.is_null()) throw Error(mfile + ": a DeepSpeed AutoEP source has no Megatron-Core name map");
  std::vector<std::string> names;
  for (const auto& p : m.params) {
    if (p.flat) throw Error(mfile + ": parameter '" + escaped_brief(p.name) + "' is in the ZeRO-3 TP = 1 flat form, "
                            "which keeps no layout; convert it with ucp-load to ZeRO-1 first");
    names.push_back(p.name);
  }
  const mc::PipeNumbering pn = pipe_numbering(m, mfile);
  const mc::ModelMap map = choose_map(names, pn, map_file, mfile);
  if (family) *family = map.family + " (" + map.origin + ")";

  // The model tensors' dtype (Megatron-Core-named manifests give the model's, not the fp32 state's:
  // docs/formats-megatron-core.md "Universal names"), from the first model file's ds_config / args.
  std::optional<std::string> model_dtype;
  if (!model_file.empty()) {
    f.model_file = model_file;
    f.model_states = load_torch(f.model_file);
    const auto tc = formats::deepspeed::training_config(f.model_states);
    if (tc.dtype) model_dtype = dtype_name(*tc.dtype);
  }
  const int64_t padded_vocab = f.model_states ? mc::padded_vocab_size(f.model_states) : 0;
  std::vector<Job>& jobs = f.jobs;
  std::optional<mc::QkvShape>& qkv = f.qkv;
  std::map<std::string, std::string> taken;  // output name -> input name
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& p = m.params[i];
    const auto mapped = *mc::to_megatron_core(map, p.name, pn);
    if (auto [it, fresh] = taken.emplace(mapped.name, p.name); !fresh)
      throw Error(map.origin + ": parameters '" + escaped_brief(it->second) + "' and '" + escaped_brief(p.name) +
                  "' both map to '" + mapped.name + "'");
    Job j;
    j.from = i;
    j.name = mapped.name;
    j.layout = map.rules[mapped.rule].layout;
    j.regroup_qkv = j.layout == mc::MapLayout::Qkv && joined_as_sub_params(p);
    if (j.regroup_qkv && !qkv) {
      if (model_file.empty()) throw Error(mfile + ": no model file copy to read the attention heads from");
      qkv = qkv_shape(model_file, p.shape.empty() ? 0 : p.shape[0]);
    }
    // Vocabulary tensors get Megatron's padded rows back (zeros, as DeepSpeed's universal loader pads):
    // a Megatron-Core-named folder keeps them as Megatron stores them (docs/formats-megatron-core.md).
    if (p.vocab_tensor && padded_vocab > 0 && !p.shape.empty() && p.shape[0] < padded_vocab)
      j.pad_rows = padded_vocab - p.shape[0];
    uv::UniversalParam& e = j.out;
    e.name = j.name;
    e.shape = p.shape;
    if (j.pad_rows) e.shape[0] += j.pad_rows;
    e.dtype = model_dtype ? model_dtype : p.dtype;
    e.step = p.step;
    e.vocab_tensor = p.vocab_tensor;
    if (p.expert) e.expert = uv::UniversalExpert{mapped.layer, p.expert->global_id};
    for (const auto& [state, file] : p.states)
      e.states[state] = {"zero/" + param_folder(j.name) + "/" + fs::path(file.file).filename().string(), std::nullopt};
    jobs.push_back(std::move(j));
  }
  f.record = {{"family", map.family},
              {"map_origin", map.origin},
              {"map", map.json},
              {"pipeline_numbering", {{"first_block", pn.first_block}, {"final_norm", pn.final_norm}, {"head", pn.head}}},
              {"qkv", qkv ? qkv_json(*qkv) : json(nullptr)},
              {"model_files_dir", kModelFilesDir},
              {"megatron_deepspeed", {{"source", m.source.to_json()},
                                      {"patterns", {{"origin", m.patterns_origin}, {"set", m.patterns_set}}},
                                      {"model_files", m.model_files},
                                      {"params", json::array()}}}};
  for (const auto& p : m.params) f.record["megatron_deepspeed"]["params"].push_back(p.to_json());
  return f;
}

// The same for universal folder `in`.
ForwardPlan plan_forward(const fs::path& in, const std::string& map_file, std::string* family) {
  const std::string mfile = (in / uv::kUniversalManifestName).string();
  uv::UniversalManifest m = uv::read_universal_manifest(mfile);
  const std::string model_file = m.model_files.empty() ? std::string() : (in / m.model_files.front()).string();
  return plan_forward(std::move(m), mfile, model_file, map_file, family);
}

// The Megatron-Core-named manifest of `f` with `params` (its jobs' entries).
uv::UniversalManifest forward_manifest(const ForwardPlan& f, std::vector<uv::UniversalParam> params) {
  uv::UniversalManifest out;
  out.source = f.m.source;
  out.source.names = "megatron-core";
  out.source.names_record = f.record;
  out.patterns_origin = "none: Megatron-Core names (the Megatron-DeepSpeed patterns are in source." +
                        std::string(kRecordKey) + ")";
  out.patterns_set = json::object();
  out.optimizer_state = f.m.optimizer_state;
  out.params = std::move(params);
  return out;
}

// A Megatron-DeepSpeed value in Megatron-Core layout: QKV rows regrouped, Megatron's padded vocabulary
// rows back (zeros, as DeepSpeed's universal loader pads).
Tensor forward_value(Tensor t, bool regroup_qkv, const std::optional<mc::QkvShape>& qkv, int64_t pad_rows) {
  if (regroup_qkv) t = mc::qkv_split_to_grouped(t, *qkv);
  if (pad_rows) {
    std::vector<int64_t> pad = t.shape();
    pad[0] = pad_rows;
    t = cat({t, Tensor::zeros(t.dtype(), pad)}, 0);
  }
  return t;
}

// The step value of the first parameter that has one (the file beside its state files), or null.
pickle::ValuePtr first_step(const fs::path& in, const uv::UniversalManifest& m) {
  for (const auto& p : m.params) {
    if (!p.step || p.states.empty()) continue;
    std::set<std::string> states;
    for (const auto& [s, f] : p.states) states.insert(fs::path(f.file).filename().string());
    const fs::path dir = (in / p.states.begin()->second.file).parent_path();
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file() && !states.count(e.path().filename().string())) return load_torch(e.path().string());
  }
  return nullptr;
}

RunSummary to_megatron_core(const std::string& input, const std::string& output, const NamesOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path in(input);
  ForwardPlan f = plan_forward(in, o.map_file, o.family);
  const uv::UniversalManifest& m = f.m;
  std::vector<Job>& jobs = f.jobs;
  if (!o.pad_vocab)
    for (auto& j : jobs) {
      if (j.pad_rows) j.out.shape[0] -= j.pad_rows;
      j.pad_rows = 0;
    }
  const std::optional<mc::QkvShape>& qkv = f.qkv;
  // The Megatron-Core common state ucp-load --format torch_dist writes (args, iteration, param_groups).
  pickle::ValuePtr common;
  if (f.model_states) {
    try {
      common = mc::common_state_from_deepspeed(f.model_states, f.model_file,
                                               load_torch((in / m.optimizer_state).string()), first_step(in, m));
    } catch (const Error& e) {
      o.reporter.warning(std::string("no ") + kMcoreCommonStateFile + " (ucp-load --format torch_dist will refuse the "
                         "folder): " + e.what());
    }
  }

  StagingDir staging(output, o.overwrite, "ucp", o.reporter.verbose, o.sync);
  const fs::path staged = staging.path();
  fs::create_directories(staged / "zero");
  Counters c;
  const int threads = parallel::thread_count(o.threads);
  run_jobs(jobs, threads, o.reporter, [&](Job& j) {
    const auto& p = m.params[j.from];
    const fs::path dir = staged / "zero" / param_folder(j.name);
    fs::create_directories(dir);
    std::set<std::string> state_files;
    for (const auto& [state, file] : p.states) {
      state_files.insert(fs::path(file.file).filename().string());
      const Tensor t = forward_value(read_param(in, file.file, c), j.regroup_qkv, qkv, j.pad_rows);
      const std::string path = (staged / j.out.states[state].file).string();
      uv::StateFile sf;
      sf.param = t;
      save_torch_file(path, uv::to_pickle(sf));
      j.out.states[state].crc32 = written_crc32(path, t);
      c.written += fs::file_size(path);
      ++c.files;
    }
    if (!p.states.empty()) copy_other_files((in / p.states.begin()->second.file).parent_path(), dir, state_files, c);
  });

  // Common files: the optimizer state as it is; the model files under megatron_deepspeed/ (templates of
  // the way back, not Megatron-Core files).
  copy_counted((in / m.optimizer_state).string(), (staged / m.optimizer_state).string(), c);
  fs::create_directories(staged / kModelFilesDir);
  for (const auto& f : m.model_files) copy_counted((in / f).string(), (staged / kModelFilesDir / f).string(), c);

  if (common) {
    const fs::path cs = staged / kMcoreCommonStateFile;
    fs::create_directories(cs.parent_path());
    save_torch_file(cs.string(), common);
    c.written += fs::file_size(cs);
    ++c.files;
    // The local-spec linears' ._extra_state objects Megatron-Core's loader asks for.
    std::vector<std::string> names;
    for (const auto& j : jobs) names.push_back(j.name);
    const auto objects = mc::extra_state_objects(names, mc::args_facts(common, cs.string()).homogeneous, cs.parent_path().string());
    if (!objects->entries.empty()) {
      const fs::path op = staged / kMcoreObjectsFile;
      save_torch_file(op.string(), objects);
      c.written += fs::file_size(op);
      ++c.files;
    }
  }

  std::vector<uv::UniversalParam> params;
  for (auto& j : jobs) params.push_back(std::move(j.out));
  write_manifest(forward_manifest(f, std::move(params)), staged, c);
  check_interrupted();
  staging.commit();
  return summary(output, m.params.size(), threads, c, t0);
}

}  // namespace

MegatronCoreView megatron_core_view(const uv::UniversalManifest& m, const std::string& mfile, const std::string& model_file,
                                    const pickle::ValuePtr& optimizer_state, const pickle::ValuePtr& step,
                                    const std::string& map_file) {
  MegatronCoreView v;
  ForwardPlan f = plan_forward(m, mfile, model_file, map_file, &v.family);
  if (!f.model_states)
    throw Error(mfile + ": no model file: the Megatron-Core common state (args, iteration) comes from the Megatron-DeepSpeed "
                "model states");
  v.common = mc::common_state_from_deepspeed(f.model_states, f.model_file, optimizer_state, step);
  v.qkv = f.qkv;
  std::vector<uv::UniversalParam> params;
  for (auto& j : f.jobs) {
    v.from.push_back(j.from);
    v.regroup_qkv.push_back(j.regroup_qkv ? 1 : 0);
    v.pad_rows.push_back(j.pad_rows);
    params.push_back(std::move(j.out));
  }
  v.manifest = forward_manifest(f, std::move(params));
  return v;
}

Tensor to_megatron_core_value(Tensor t, const MegatronCoreView& v, size_t i, const std::string& where) {
  t = forward_value(std::move(t), v.regroup_qkv[i] != 0, v.qkv, v.pad_rows[i]);
  if (t.shape() != v.manifest.params[i].shape)
    throw Error(where + ": shape " + shape_str(t.shape()) + ", the Megatron-Core parameter '" + v.manifest.params[i].name +
                "' is " + shape_str(v.manifest.params[i].shape));
  return t;
}

DeepSpeedView megatron_deepspeed_view(const uv::UniversalManifest& m, const std::string& mfile,
                                      const std::string& template_dir, const std::string& map_file, bool fresh_template) {
  if (m.source.names_record.is_null() && !is_megatron_core_named(m.source) && m.source.format != "torch_dist")
    throw Error(mfile + ": this universal folder already has Megatron-DeepSpeed names");
  // Weights without a training run (a Hugging Face import) take the model files of a fresh run
  // (hf_megatron_deepspeed.h, made when --template is left out): a real run's template would carry its
  // iteration, learning-rate schedule and data position, so a run resumed from the output would not start
  // where a fresh run does.
  if (m.source.weights_only.value_or(false) && !fresh_template)
    throw Error(mfile + ": weights without a training run (an import of a Hugging Face folder) take the model files of "
                "a fresh Megatron-DeepSpeed run; a template's would carry that run's iteration, learning-rate schedule "
                "and data position: leave --template out (docs/hf.md)");
  // The Megatron-DeepSpeed facts: the input's record, or the --template's (its record, or planned from
  // its Megatron-DeepSpeed names). `facts_dir` holds the model files (under model_files_dir) and the
  // DeepSpeed zero/optimizer_state.pt.
  DeepSpeedView v;
  json record;
  fs::path facts_dir = fs::path(mfile).parent_path();
  std::string where = mfile + ": source." + std::string(kRecordKey);
  if (!template_dir.empty()) {
    const fs::path t(template_dir);
    if (!formats::is_kind(template_dir, formats::kUniversal))
      throw Error(template_dir + ": --template must be a universal folder (ucp-union of the Megatron-DeepSpeed "
                  "checkpoint, or its --to-names megatron-core folder)");
    const std::string tfile = (t / uv::kUniversalManifestName).string();
    const auto tm = uv::read_universal_manifest(tfile);
    if (!tm.source.names_record.is_null()) {
      record = tm.source.names_record;
      where = tfile + ": source." + std::string(kRecordKey);
    } else {
      record = plan_forward(t, map_file, nullptr).record;
      record["model_files_dir"] = "";
      v.template_named_ds = true;
      where = tfile;
    }
    facts_dir = t;
    v.template_dir = template_dir;
  } else {
    if (m.source.names_record.is_null())
      throw Error(mfile + ": a Megatron-Core-named universal folder without source." + std::string(kRecordKey) +
                  " (not made by ucp-union --to-names megatron-core): give --template <the Megatron-DeepSpeed "
                  "universal folder> for its names, patterns and model files (docs/megatron-core-mapping.md)");
    if (!map_file.empty())
      throw UsageError("--model-map: the way back uses the map recorded in " + mfile + "; leave --model-map out");
    record = m.source.names_record;
  }
  if (!record.is_object() || !record.contains("map") || !record.contains("megatron_deepspeed") ||
      !record.contains("pipeline_numbering"))
    throw Error(where + " is malformed (map, pipeline_numbering and megatron_deepspeed expected)");
  const mc::ModelMap map = mc::ModelMap::from_json(record["map"], where + ".map");
  v.family = map.family + " (" + record.value("map_origin", map.origin) + ")";
  mc::PipeNumbering pn;
  pn.first_block = record["pipeline_numbering"].value("first_block", -1);
  pn.final_norm = record["pipeline_numbering"].value("final_norm", -1);
  pn.head = record["pipeline_numbering"].value("head", -1);
  if (!record.value("qkv", json()).is_null()) v.qkv = qkv_from_json(record["qkv"], mfile);
  const json& ds = record["megatron_deepspeed"];
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < m.params.size(); ++i) by_name[m.params[i].name] = i;

  const json& params = ds.at("params");
  for (size_t i = 0; i < params.size(); ++i) {
    auto e = uv::UniversalParam::from_json(params[i], mfile, "source." + std::string(kRecordKey) +
                                                                 ".megatron_deepspeed.params[" + std::to_string(i) + "]");
    const auto mapped = mc::to_megatron_core(map, e.name, pn);
    if (!mapped) throw Error(where + ": the recorded map names no rule for '" + escaped_brief(e.name) + "'");
    auto it = by_name.find(mapped->name);
    if (it == by_name.end())
      throw Error(mfile + ": parameter '" + mapped->name + "' (Megatron-DeepSpeed '" + escaped_brief(e.name) +
                  "') is missing");
    const bool regroup = map.rules[mapped->rule].layout == mc::MapLayout::Qkv && joined_as_sub_params(e);
    if (regroup && !v.qkv) throw Error(where + ": no qkv shape recorded for '" + escaped_brief(e.name) + "'");
    const auto& from = m.params[it->second];
    for (const auto& [state, file] : e.states)
      if (!from.states.count(state))
        throw Error(mfile + ": parameter '" + from.name + "' has no " + state + " state (its Megatron-DeepSpeed entry has)");
    v.from.push_back(it->second);
    v.regroup_qkv.push_back(regroup ? 1 : 0);
    by_name.erase(it);
    v.manifest.params.push_back(std::move(e));
  }
  if (!by_name.empty())
    throw Error(mfile + ": parameter '" + escaped_brief(by_name.begin()->first) +
                "' has no Megatron-DeepSpeed name in the record (added after the conversion?)");
  if (ds.contains("source")) {
    v.manifest.source = uv::UniversalSource::from_json(ds["source"], where + ".megatron_deepspeed.source");
  } else {
    v.manifest.source = m.source;
    v.manifest.source.names.reset();
    v.manifest.source.names_record = nullptr;
  }
  v.manifest.patterns_origin = ds.at("patterns").value("origin", std::string());
  v.manifest.patterns_set = ds.at("patterns").at("set");
  v.manifest.optimizer_state = uv::kUniversalOptimizerState;
  v.optimizer_state = (facts_dir / uv::kUniversalOptimizerState).string();
  const std::string dir = record.value("model_files_dir", std::string(kModelFilesDir));
  for (const auto& f : ds.at("model_files")) {
    const std::string name = f.get<std::string>();
    v.manifest.model_files.push_back(name);
    v.model_files.push_back((facts_dir / dir / name).string());
  }
  return v;
}

Tensor to_deepspeed_value(Tensor t, const DeepSpeedView& v, size_t i, const std::string& where, bool own_storage) {
  const uv::UniversalParam& out = v.manifest.params[i];
  if (v.regroup_qkv[i]) t = mc::qkv_grouped_to_split(t, *v.qkv);
  // A torch_dist save keeps Megatron's padded vocabulary rows; the Megatron-DeepSpeed universal form
  // cuts them to original_vocab_size (vocab_tensor), as ucp-union does.
  if (out.vocab_tensor && t.dim() == static_cast<int64_t>(out.shape.size()) && t.dim() > 0 && t.shape()[0] > out.shape[0] &&
      std::equal(t.shape().begin() + 1, t.shape().end(), out.shape.begin() + 1))
    t = t.narrow(0, 0, out.shape[0]).contiguous(own_storage);  // own storage: a file then holds only these rows
  if (t.shape() != out.shape)
    throw Error(where + ": shape " + shape_str(t.shape()) + ", the Megatron-DeepSpeed parameter '" + out.name + "' is " +
                shape_str(out.shape));
  return t;
}

std::vector<mc::RowRun> deepspeed_value_rows(std::vector<int64_t> shape, const DeepSpeedView& v, size_t i,
                                             const std::string& where) {
  const uv::UniversalParam& out = v.manifest.params[i];
  const int64_t rows = shape.empty() ? 1 : shape[0];
  std::vector<mc::RowRun> runs;
  if (v.regroup_qkv[i])
    runs = mc::qkv_grouped_to_split_rows(shape.size(), rows, *v.qkv);
  else if (rows > 0)
    runs.push_back({0, 0, rows});
  if (out.vocab_tensor && shape.size() == out.shape.size() && !shape.empty() && shape[0] > out.shape[0] &&
      std::equal(shape.begin() + 1, shape.end(), out.shape.begin() + 1)) {  // the padded vocabulary rows cut
    const int64_t keep = out.shape[0];
    std::vector<mc::RowRun> cut;
    for (const auto& r : runs)
      if (r.out < keep) cut.push_back({r.out, r.in, std::min(r.rows, keep - r.out)});
    runs = std::move(cut);
    shape[0] = keep;
  }
  if (shape != out.shape)
    throw Error(where + ": shape " + shape_str(shape) + ", the Megatron-DeepSpeed parameter '" + out.name + "' is " +
                shape_str(out.shape));
  return runs;
}

namespace {

// The fresh run's template folder of a Hugging Face import, `.<output>.ucp-fresh-mds-<pid>` beside the output (after
// sweeping those of dead runs): removed when done, or on a stop signal, or by the next run after a SIGKILL.
fs::path fresh_template_dir(const std::string& output, const Reporter& reporter) {
  const fs::path out = fs::absolute(output).lexically_normal();
  const std::string prefix = "." + out.filename().string() + ".ucp-fresh-mds-";
  sweep_stale_pid_folders(out.parent_path(), prefix, [&](const std::string& m) { reporter.detail(m); });
  return out.parent_path() / (prefix + std::to_string(getpid()));
}

RunSummary to_megatron_deepspeed(const std::string& input, const std::string& output, const NamesOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path in(input);
  const std::string mfile = (in / uv::kUniversalManifestName).string();
  const uv::UniversalManifest m = uv::read_universal_manifest(mfile);
  // A Hugging Face import without --template: a fresh run's template beside the output, removed at the end.
  std::string template_dir = o.template_dir;
  std::optional<OwnedFolder> fresh;
  if (template_dir.empty() && is_hf_import(m)) {
    fresh.emplace(fresh_template_dir(output, o.reporter));
    template_dir = fresh->path().string();
    write_fresh_megatron_deepspeed(input, template_dir);
    o.reporter.warning("a Hugging Face import takes the model files of a fresh Megatron-DeepSpeed run (iteration 0, "
                       "no scheduler or RNG state: Megatron-DeepSpeed loads it with --finetune, docs/hf.md)");
  }
  DeepSpeedView v = megatron_deepspeed_view(m, mfile, template_dir, o.map_file, fresh.has_value());
  if (o.family) *o.family = v.family;
  const auto set = patterns::PatternSet::from_json(v.manifest.patterns_set, v.manifest.patterns_origin);
  std::vector<Job> jobs;
  for (size_t i = 0; i < v.manifest.params.size(); ++i) {
    Job j;
    j.from = v.from[i];
    j.name = v.manifest.params[i].name;
    j.out = v.manifest.params[i];
    jobs.push_back(std::move(j));
  }

  StagingDir staging(output, o.overwrite, "ucp", o.reporter.verbose, o.sync);
  const fs::path staged = staging.path();
  fs::create_directories(staged / "zero");
  Counters c;
  const int threads = parallel::thread_count(o.threads);
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  Reporter::Bar progress(o.reporter, "ucp-union", jobs.size());
  convert_each(order, threads, progress, [&](size_t i) {
    Job& j = jobs[i];
    const auto& p = m.params[j.from];
    const auto rule = patterns::classify(set, j.name);
    std::set<std::string> state_files;
    for (auto& [state, file] : j.out.states) {
      const auto& from = p.states.at(state);
      state_files.insert(fs::path(from.file).filename().string());
      const Tensor t = to_deepspeed_value(read_param(in, from.file, c), v, i, (in / from.file).string());
      const fs::path path = staged / file.file;
      fs::create_directories(path.parent_path());
      save_torch_file(path.string(), state_file_value(t, rule, set));
      file.crc32 = written_crc32(path.string(), t);
      c.written += fs::file_size(path);
      ++c.files;
    }
    if (j.out.states.empty()) return;
    const fs::path to_dir = (staged / j.out.states.begin()->second.file).parent_path();
    size_t copied = p.states.empty() ? 0 : copy_other_files((in / p.states.begin()->second.file).parent_path(), to_dir,
                                                            state_files, c);
    // The step file: the input's (its values travel), else the template's of this parameter.
    if (j.out.step && copied == 0 && !v.template_dir.empty()) {
      const std::string folder = param_folder(v.template_named_ds ? j.name : p.name);
      copied = copy_other_files(fs::path(v.template_dir) / "zero" / folder, to_dir, state_files, c);
    }
    if (j.out.step && copied == 0)
      throw Error(mfile + ": parameter '" + p.name + "' has no step file (its Megatron-DeepSpeed entry has one)");
  });
  progress.finish();

  // DeepSpeed's zero/optimizer_state.pt (loss scaler, ZeRO facts, param_groups) from the facts' folder.
  copy_counted(v.optimizer_state, (staged / m.optimizer_state).string(), c);
  uv::UniversalManifest out = v.manifest;
  out.optimizer_state = m.optimizer_state;
  out.params.clear();
  for (size_t k = 0; k < v.model_files.size(); ++k)
    copy_counted(v.model_files[k], (staged / v.manifest.model_files[k]).string(), c);
  for (auto& j : jobs) out.params.push_back(std::move(j.out));
  write_manifest(out, staged, c);
  check_interrupted();
  staging.commit();
  return summary(output, out.params.size(), threads, c, t0);
}

}  // namespace

bool is_megatron_core_named(const uv::UniversalSource& source) { return source.names == "megatron-core"; }

RunSummary rename_universal(const std::string& input, const std::string& output, const NamesOptions& options) {
  return options.target == NamesTarget::MegatronCore ? to_megatron_core(input, output, options)
                                                     : to_megatron_deepspeed(input, output, options);
}

}  // namespace ucpkit::to_universal
