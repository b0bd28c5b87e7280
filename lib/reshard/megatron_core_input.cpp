// The Megatron-Core-named input of --format torch_dist and --format hf (megatron_core_input.h).
#include "reshard/megatron_core_input.h"

#include <filesystem>
#include <map>
#include <optional>

#include "core/confine.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/registry.h"
#include "formats/detect.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/deepspeed_common_state.h"
#include "formats/universal/state_file.h"
#include "io/torch/torch_file.h"
#include "reshard/direct_source.h"
#include "reshard/model_info.h"
#include "reshard/universal_reader.h"
#include "to_universal/direct.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

using pickle::Kind;
using pickle::ValuePtr;

// A DeepSpeed / Megatron-DeepSpeed checkpoint (read directly, as ucp-load's direct mode) or its
// Megatron-DeepSpeed-named universal folder, read as the Megatron-Core-named folder ucp-union --to-names
// megatron-core would write (to_universal::MegatronCoreView): one pass, no folder in between. Each
// parameter state is read whole (fp32) when its first chunk is written.
struct ForwardInput {
  to_universal::ExtractPlan plan;  // a native input's extract plan
  ModelInfo model;
  std::unique_ptr<DirectSource> source;  // a native input's atomic tensors
  std::unique_ptr<UniversalReader> reader;
  to_universal::MegatronCoreView view;
  std::vector<int> model_param;  // per view param: its index in model.params
};

namespace {

// The UniversalMeta of `input` when it is read through ForwardInput: a native checkpoint (meta from its
// extract plan, kept in `plan`), or a universal folder in Megatron-DeepSpeed names made from one (no
// Megatron-Core common state recorded); nullopt otherwise (a Megatron-Core-named folder, or a folder
// direct mode does not read, such as DCP or torch_dist, converted by a real run first in ucp-load's tool layer).
std::optional<UniversalMeta> forward_meta(const std::string& input, to_universal::ExtractPlan& plan) {
  const formats::FolderKind kind = formats::detect(input);
  if (!kind.is(formats::kUniversal)) {
    if (!is_direct_input(kind)) return std::nullopt;
    plan = direct_plan(input, kind);
    return direct_meta(plan);
  }
  if (fs::exists(fs::path(input) / kMegatronCoreCommonStateFile)) return std::nullopt;
  UniversalMeta meta = read_universal_meta(input);
  const auto& src = meta.manifest.source;
  if (to_universal::is_megatron_core_named(src) || src.format_name() != "deepspeed") return std::nullopt;
  return meta;
}

std::shared_ptr<ForwardInput> open_forward_input(const LoadOptions& o) {
  auto f = std::make_shared<ForwardInput>();
  std::optional<UniversalMeta> meta = forward_meta(o.input, f->plan);
  if (!meta) return nullptr;
  if (meta->dir.empty()) {  // a native checkpoint, read as direct mode reads it
    f->model = model_info_from(*meta);
    f->source = std::make_unique<DirectSource>(f->plan, f->model, o.verify);
    f->reader = std::make_unique<UniversalReader>(f->model, "", false);
    f->reader->set_source(f->source.get());
  } else {
    f->model = read_model_info(*meta);
    f->reader = std::make_unique<UniversalReader>(f->model, o.input, o.verify);
  }
  std::map<std::string, int> index;
  for (size_t i = 0; i < f->model.params.size(); ++i) index[f->model.params[i].name] = static_cast<int>(i);
  ValuePtr step;
  for (size_t i = 0; i < f->model.params.size() && !step; ++i) step = f->reader->step(static_cast<int>(i));
  const ValuePtr optimizer_state = f->model.optimizer_state ? f->model.optimizer_state : load_torch(meta->optimizer_state_path);
  f->view = to_universal::megatron_core_view(meta->manifest, meta->manifest_path,
                                             meta->model_files.empty() ? std::string() : meta->model_files.front(),
                                             optimizer_state, step, o.model_map);
  for (const size_t from : f->view.from) {
    const auto it = index.find(meta->manifest.params.at(from).name);
    if (it == index.end()) throw Error(meta->manifest_path + ": parameter '" + meta->manifest.params.at(from).name + "' is not in the model (internal)");
    f->model_param.push_back(it->second);
  }
  return f;
}

NamedTable<MegatronCoreReader>& readers() {
  static NamedTable<MegatronCoreReader> r;
  return r;
}

}  // namespace

bool register_megatron_core_reader(std::string_view kind, MegatronCoreReader reader) {
  return readers().set(std::string(kind), std::move(reader));
}

MegatronCoreReader megatron_core_reader(const formats::FolderKind& kind) { return readers().find(kind.format); }

bool reads_megatron_core_directly(const formats::FolderKind& kind) { return static_cast<bool>(megatron_core_reader(kind).open); }

MegatronCoreInput open_megatron_core_input(const LoadOptions& o, std::string_view format) {
  const std::string fmt(format);
  if (const auto kind = fs::is_directory(o.input) ? formats::try_detect(o.input) : std::nullopt)
    if (const MegatronCoreReader reader = megatron_core_reader(*kind); reader.open) return reader.open(o, format);
  MegatronCoreInput p;
  p.dir = o.input;
  p.manifest_path = (fs::path(o.input) / formats::universal::kUniversalManifestName).string();
  // Where the common state comes from (messages): the folder's record, or the model file it is made from.
  p.common_path = (fs::path(o.input) / kMegatronCoreCommonStateFile).string();
  if (!fs::is_directory(o.input))
    throw Error(o.input + (fs::exists(o.input) ? ": not a folder" : ": no such folder") + " (--format " + fmt +
                " reads a DeepSpeed checkpoint, its universal folder, a torch_dist save, or a Megatron-Core-named "
                "universal folder)");
  if ((p.forward = open_forward_input(o))) {
    p.manifest = p.forward->view.manifest;
    p.common = p.forward->view.common;
    p.family = p.forward->view.family;
    std::vector<std::string> names;
    for (const auto& e : p.manifest.params) names.push_back(e.name);
    p.extra_keys = formats::megatron_core::extra_state_keys(names, formats::megatron_core::args_facts(p.common, o.input).homogeneous);
    p.common_path = o.input + " (the Megatron-Core common state made from its model file)";
    o.reporter.warning(o.input + ": Megatron-DeepSpeed names written as Megatron-Core's (model family " + p.family +
                       "; docs/megatron-core-mapping.md), read in one pass");
    return p;
  }
  if (!o.model_map.empty())
    throw UsageError("--model-map: " + o.input + " is read in Megatron-Core names as it is (the map applies to a "
                     "DeepSpeed / Megatron-DeepSpeed input)");
  if (!fs::exists(p.manifest_path))
    throw Error(o.input + ": a " + formats::detect(o.input).name() + " folder, no " +
                std::string(formats::universal::kUniversalManifestName) + ": --format " + fmt +
                " reads a Megatron-Core-named universal folder (a torch_dist or DCP input is converted into one by a "
                "real run, not by --plan / --dry-run: ucp-union it first)");
  p.manifest = formats::universal::read_universal_manifest(p.manifest_path);
  // The writers name parameters by Megatron-Core's key model (formats/megatron_core/key_model), which has
  // no key for a DCP's buffer or counter: refused rather than dropped.
  if (!p.manifest.buffers.empty())
    throw Error(p.manifest_path + ": " + formats::universal::describe_buffers(p.manifest.buffers) + " without optimizer state: --format " +
                fmt + " writes Megatron-Core's parameter keys only and has no key for them; write --format dcp or safetensors, "
                "which keep them");
  if (!fs::exists(p.common_path))
    throw Error(p.common_path + ": missing: --format " + fmt + " needs the Megatron-Core common state (args, iteration, "
                "optimizer param_groups) that ucp-union --input <torch_dist> records; a DCP checkpoint has none "
                "(docs/formats-megatron-core.md)");
  p.common = load_torch(p.common_path);
  if (!p.common || !p.common->is(Kind::Dict)) fail(p.common_path, "not a dict (Megatron-Core common state)");
  const std::string objects_path = (fs::path(o.input) / kMegatronCoreObjectsFile).string();
  if (fs::exists(objects_path)) {
    p.objects = load_torch(objects_path);
    if (!p.objects || !p.objects->is(Kind::Dict)) fail(objects_path, "not a dict of ShardedObject bytes");
  }
  return p;
}

Tensor MegatronCoreInput::streamed_value(size_t param, const std::string& state, bool verify, uint64_t& read) const {
  if (!streams) return value(param, state, verify, read);
  Tensor t = streams(param, state, verify, read);
  const auto& e = manifest.params.at(param);
  if (t.shape() != e.shape || t.dtype() != DType::Float32)
    throw Error(dir + ": " + e.name + " " + state + ": shape or dtype differs from the plan's (internal)");
  return t;
}

Tensor MegatronCoreInput::value(size_t param, const std::string& state, bool verify, uint64_t& read) const {
  const auto& e = manifest.params.at(param);
  Tensor t;
  if (states) {
    t = states(param, state, read);
    if (t.shape() != e.shape) throw Error(dir + ": " + e.name + " " + state + ": shape differs from the plan's (internal)");
    return t.dtype() == DType::Float32 ? t : t.to(DType::Float32);
  }
  if (forward) {  // the Megatron-DeepSpeed state read whole (fp32), then in Megatron-Core layout
    const ForwardInput& f = *forward;
    const int mp = f.model_param.at(param);
    t = read_whole_tensor(f.model, *f.reader, mp, state, DType::Float32);
    read += t.nbytes();
    return to_universal::to_megatron_core_value(std::move(t), f.view, param,
                                                dir + ": " + f.model.params[static_cast<size_t>(mp)].name + " " + state);
  }
  const auto it = e.states.find(state);
  if (it == e.states.end()) throw Error(manifest_path + ": parameter " + e.name + " has no " + state + " state");
  const std::string path = confined_path(dir, it->second.file, manifest_path, e.name + " " + state + " file").string();
  t = formats::universal::read_state_file(load_torch(path), path).param.contiguous();
  if (t.shape() != e.shape) fail(path, "shape differs from the manifest's");
  if (verify && it->second.crc32) {  // manifest.json's crc32 of the tensor's elements
    const uint32_t crc = crc32_parallel(t.contiguous_bytes());
    if (crc != *it->second.crc32)
      fail(path, "checksum mismatch: crc32 " + formats::universal::crc32_text(crc) + ", " + manifest_path +
                     " records " + formats::universal::crc32_text(*it->second.crc32));
  }
  read += t.nbytes();
  if (t.dtype() != DType::Float32) t = t.to(DType::Float32);
  return t;
}

int64_t MegatronCoreInput::rows_added(size_t param) const {
  return forward && param < forward->view.pad_rows.size() ? forward->view.pad_rows[param] : 0;
}

std::optional<DType> MegatronCoreInput::model_dtype() const {
  if (!manifest.params.empty() && manifest.params[0].dtype) return dtype_from_name(*manifest.params[0].dtype);
  return std::nullopt;
}

}  // namespace ucpkit::reshard
