// Megatron-Core torch_dist -> universal form (from_torch_dist.h). Format facts and their Megatron-LM
// source lines: docs/formats-megatron-core.md.
#include "to_universal/from_torch_dist.h"
#include "to_universal/union_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <memory>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/staging.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/detect.h"
#include "formats/megatron_core/dp_bucket_layout.h"
#include "formats/megatron_core/reader.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "parallel/staging.h"
#include "parallel/threads.h"
#include "to_universal/plan.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using formats::megatron_core::BucketLayout;
using formats::megatron_core::BucketParam;
using formats::megatron_core::Checkpoint;
using formats::megatron_core::Key;
using formats::megatron_core::KeyKind;
using formats::megatron_core::ModelParam;
using formats::megatron_core::OptimizerFormat;
using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// [start, end) of the flat bucket tensor `fqn`, from only the chunks that overlap it (Megatron saves
// one chunk per parameter range and padding gap: optimizer/distrib_optimizer.py:1900-1930).
Tensor read_flat_range(const formats::dcp::Reader& reader, const std::string& fqn, int64_t start, int64_t end) {
  const auto& md = reader.metadata();
  const formats::dcp::Entry* e = md.find(fqn);
  if (!e || e->is_bytes || e->size.size() != 1 || start < 0 || end > e->size[0] || start > end)
    fail(md.path, "Megatron-Core torch_dist: bucket " + escaped_brief(fqn) + " does not hold [" + std::to_string(start) +
                      ", " + std::to_string(end) + ")");
  const size_t es = dtype_size(e->dtype);
  std::vector<uint8_t> out(static_cast<size_t>(end - start) * es);
  int64_t covered = 0;
  for (size_t k = 0; k < e->chunks.size(); ++k) {
    const auto& c = e->chunks[k];
    const int64_t a = std::max(start, c.offsets[0]), b = std::min(end, c.offsets[0] + c.sizes[0]);
    if (a >= b) continue;
    const Tensor chunk = reader.read_chunk(fqn, k).contiguous();
    const auto bytes = chunk.contiguous_bytes();
    std::memcpy(out.data() + static_cast<size_t>(a - start) * es, bytes.data() + static_cast<size_t>(a - c.offsets[0]) * es,
                static_cast<size_t>(b - a) * es);
    covered += b - a;
  }
  if (covered != end - start)
    fail(md.path, "Megatron-Core torch_dist: the chunks of " + escaped_brief(fqn) + " do not cover [" +
                      std::to_string(start) + ", " + std::to_string(end) + ")");
  return Tensor::from_bytes(e->dtype, {end - start}, std::move(out));
}

// The bucket key of `state` in the same bucket as `param_key` (…bucket_idx_{k}.param).
std::string state_bucket(const Key& param_key, const std::string& state) {
  const std::string& f = param_key.fqn;
  return f.substr(0, f.size() - param_key.state.size()) + state;
}

struct Piece {
  const BucketLayout* layout = nullptr;
  const BucketParam* bp = nullptr;
};

// dp_reshardable: a parameter's state joined from its TP-local pieces.
Tensor join_pieces(const Checkpoint& ck, const TorchDistParam& p, const std::vector<Piece>& pieces, const std::string& state) {
  const std::string& file = ck.dcp().metadata().path;
  std::vector<std::pair<int64_t, Tensor>> parts;  // (offset along dim, part)
  int dim = -1;
  for (const auto& pc : pieces) {
    const BucketParam& bp = *pc.bp;
    const std::string fqn = state_bucket(*pc.layout->bucket, state);
    Tensor local = read_flat_range(ck.dcp(), fqn, bp.start, bp.end).reshape(bp.local_shape);
    if (local.dtype() != DType::Float32) local = local.to(DType::Float32);
    if (bp.dim < 0) {
      if (local.shape() != p.shape)
        fail(file, "Megatron-Core torch_dist: " + escaped_brief(p.name) + " in " + escaped_brief(fqn) + " has shape " +
                       shape_str(local.shape()) + ", the parameter " + shape_str(p.shape));
      return local;  // not TP-split: every TP rank's bucket holds the same copy
    }
    dim = bp.dim;
    for (size_t j = 0; j < bp.offsets.size(); ++j) parts.push_back({bp.offsets[j], local.narrow(bp.dim, static_cast<int64_t>(j) * bp.size, bp.size)});
  }
  std::sort(parts.begin(), parts.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  int64_t at = 0;
  std::vector<Tensor> ts;
  for (auto& [o, t] : parts) {
    if (o != at) fail(file, "Megatron-Core torch_dist: the TP pieces of " + escaped_brief(p.name) + " leave rows " + std::to_string(at) + " unfilled");
    at += t.shape()[dim];
    ts.push_back(std::move(t));
  }
  if (dim < 0 || at != p.shape[dim])
    fail(file, "Megatron-Core torch_dist: the TP pieces of " + escaped_brief(p.name) + " do not fill its shape " + shape_str(p.shape));
  return cat(ts, dim).contiguous(true);
}

}  // namespace

TorchDistPlan plan_torch_dist(const Checkpoint& ck) {
  TorchDistPlan plan;
  plan.optimizer_format = std::string(formats::megatron_core::optimizer_format_name(ck.optimizer_format()));
  const auto& md = ck.dcp().metadata();
  const int states = ck.optimizer_format() == OptimizerFormat::None ? 1 : 3;
  for (size_t i = 0; i < ck.params().size(); ++i) {
    const ModelParam& mp = ck.params()[i];
    TorchDistParam p;
    p.name = mp.slice.name;
    p.model_param = i;
    p.shape = mp.slice.shape;
    p.dtype = md.find(mp.fqn)->dtype;
    p.bytes = static_cast<uint64_t>(numel_of(p.shape)) * 4 * states;
    plan.params.push_back(std::move(p));
  }
  // Experts per MoE layer, from the model keys (a layer's expert axis or its per-expert keys): what
  // ucp-info reports (a torch_dist MoE save was described as having no MoE layers).
  std::map<int64_t, int64_t> experts;  // global layer -> experts
  for (const ModelParam& mp : ck.params()) {
    const auto& mk = mp.key->model;
    if (!mk.expert_axis && !mk.expert) continue;
    const size_t at = mk.layer_axis ? 1 : 0;
    const auto layer = mk.layer_axis && !mp.slice.index.empty() ? std::optional<int64_t>(mp.slice.index[0]) : mk.layer;
    const auto expert = mk.expert_axis && mp.slice.index.size() > at ? std::optional<int64_t>(mp.slice.index[at]) : mk.expert;
    if (layer && expert) experts[*layer] = std::max(experts[*layer], *expert + 1);
  }
  const auto args = formats::megatron_core::args_facts(ck.common().root, ck.common().source);
  nlohmann::json moe = nlohmann::json::object();
  for (const auto& [layer, n] : experts) moe[std::to_string(layer)] = n;
  nlohmann::json td = {{"folder", ck.dir()},
                       {"etp", args.etp},
                       {"experts", args.num_experts},
                       {"experts_per_layer", moe},
                       {"optimizer_format", plan.optimizer_format},
                       {"sharded_backend_version", ck.config().sharded_backend_version},
                       {"legacy_common_pt", ck.common().legacy},
                       {"entries", md.entries.size()},
                       {"layers", args.num_layers}};
  if (const auto it = ck.common().iteration()) td["iteration"] = *it;
  if (const auto v = ck.common().checkpoint_version()) td["megatron_checkpoint_version"] = *v;
  plan.source.format = "torch_dist";
  plan.source.tp = args.tp;
  plan.source.pp = args.pp;
  plan.source.dp = args.dp;
  plan.source.ep = args.ep;
  plan.source.facts["torch_dist"] = std::move(td);
  // Megatron's "release" folder (save_checkpoint(release=True), training/checkpointing.py:1012): pretrained
  // weights, which its load_checkpoint starts from without optimizer state (:2473, :2555).
  if (fs::path(ck.dir()).filename() == "release") plan.source.weights_only = true;
  return plan;
}

namespace {

// A dp_reshardable save's bucket layouts (dense, then expert), recomputed and checked against the saved
// per_bucket_numel and the plan's parameters: what the union reads by, and what ucp-info's plan check
// runs, so that both refuse the same saves.
std::vector<BucketLayout> checked_bucket_layouts(const Checkpoint& ck, const TorchDistPlan& plan) {
  std::vector<BucketLayout> layouts = formats::megatron_core::dense_bucket_layouts(ck);
  bool experts = false;
  for (const Key* k : ck.buckets()) experts = experts || k->chain > 0;
  if (experts)
    for (auto& l : formats::megatron_core::expert_bucket_layouts(ck)) layouts.push_back(std::move(l));
  formats::megatron_core::check_per_bucket_numel(ck, layouts);
  std::set<std::string> placed;
  for (const auto& l : layouts)
    for (const auto& bp : l.params) placed.insert(bp.name);
  for (const auto& p : plan.params)
    if (!placed.count(p.name))
      fail(ck.dcp().metadata().path, "Megatron-Core torch_dist dp_reshardable: parameter " + escaped_brief(p.name) +
                                         " is in no recomputed bucket layout");
  return layouts;
}

}  // namespace

DcpPlan dcp_plan_of_torch_dist(const std::string& input) {
  const Checkpoint ck(input);
  const TorchDistPlan tp = plan_torch_dist(ck);
  if (ck.optimizer_format() == OptimizerFormat::DpReshardable) checked_bucket_layouts(ck, tp);
  DcpPlan plan;
  plan.optimizer = ck.optimizer_format() != OptimizerFormat::None;
  for (const auto& p : tp.params) {
    DcpParam d;
    d.name = p.name;
    d.shape = p.shape;
    d.dtype = p.dtype;
    d.bytes = p.bytes;
    d.states["fp32"] = ck.params()[p.model_param].fqn;
    if (plan.optimizer) {
      d.states["exp_avg"] = d.states["exp_avg_sq"] = d.states["fp32"];
      d.step = "step";
    }
    plan.params.push_back(std::move(d));
  }
  plan.source = tp.source;
  return plan;
}

struct TorchDistStates::Pieces {
  std::vector<BucketLayout> layouts;
  std::map<std::string, std::vector<Piece>> of;  // dp_reshardable: parameter -> its TP-local pieces
};

TorchDistStates::TorchDistStates(const std::string& input)
    : ck_(std::make_unique<Checkpoint>(input)), plan_(plan_torch_dist(*ck_)), pieces_(std::make_unique<Pieces>()) {
  const Checkpoint& ck = *ck_;
  if (ck.optimizer_format() == OptimizerFormat::DpReshardable) {
    auto& layouts = pieces_->layouts;
    layouts = checked_bucket_layouts(ck, plan_);
    for (const auto& l : layouts)
      for (const auto& bp : l.params) pieces_->of[bp.name].push_back({&l, &bp});
  }
  common_ = formats::megatron_core::fully_reshardable_common_state(ck);
  if (has_optimizer()) {
    groups_ = formats::megatron_core::saved_param_groups(common_, ck.common().source);
    step_ = formats::megatron_core::saved_step(groups_);
  }
}

TorchDistStates::~TorchDistStates() = default;

bool TorchDistStates::has_optimizer() const { return ck_->optimizer_format() != OptimizerFormat::None; }

std::vector<std::string> TorchDistStates::states() const {
  if (!has_optimizer()) return {"fp32"};
  std::vector<std::string> out;
  for (const char* s : formats::megatron_core::kOptimizerStates) out.push_back(formats::megatron_core::universal_state_name(s));
  return out;
}

Tensor TorchDistStates::read(size_t param, const std::string& state) const {
  const TorchDistParam& p = plan_.params.at(param);
  const ModelParam& mp = ck_->params()[p.model_param];
  std::string stored;  // Megatron's name of the state
  for (const char* s : formats::megatron_core::kOptimizerStates)
    if (formats::megatron_core::universal_state_name(s) == state) stored = s;
  Tensor t;
  switch (ck_->optimizer_format()) {
    case OptimizerFormat::FullyReshardable: t = ck_->read_param(mp, stored); break;
    case OptimizerFormat::DpReshardable: t = join_pieces(*ck_, p, pieces_->of.at(p.name), stored); break;
    case OptimizerFormat::None: t = ck_->read_param(mp); break;
  }
  if (t.dtype() != DType::Float32) t = t.to(DType::Float32);
  if (t.shape() != p.shape)
    fail(ck_->dcp().metadata().path, "Megatron-Core torch_dist: " + escaped_brief(p.name) + " " + state + " has shape " +
                                         shape_str(t.shape()) + ", the parameter " + shape_str(p.shape));
  return t;
}

std::unique_ptr<formats::dcp::RangeReader> TorchDistStates::range(size_t param, const std::string& state) const {
  const TorchDistParam& p = plan_.params.at(param);
  const ModelParam& mp = ck_->params()[p.model_param];
  std::unique_ptr<formats::dcp::RangeReader> r;
  switch (ck_->optimizer_format()) {
    case OptimizerFormat::FullyReshardable: {
      std::string stored;  // Megatron's name of the state
      for (const char* s : formats::megatron_core::kOptimizerStates)
        if (formats::megatron_core::universal_state_name(s) == state) stored = s;
      r = ck_->range_param(mp, stored);
      break;
    }
    case OptimizerFormat::DpReshardable: return nullptr;
    case OptimizerFormat::None: r = ck_->range_param(mp); break;
  }
  if (!r || r->dtype() != DType::Float32) return nullptr;
  if (r->shape() != p.shape)
    fail(ck_->dcp().metadata().path, "Megatron-Core torch_dist: " + escaped_brief(p.name) + " " + state + " has shape " +
                                         shape_str(r->shape()) + ", the parameter " + shape_str(p.shape));
  return r;
}

formats::universal::UniversalParam torch_dist_entry(const TorchDistParam& p, const std::vector<std::string>& states,
                                                    bool step) {
  formats::universal::UniversalParam e;
  e.name = p.name;
  e.shape = p.shape;
  e.dtype = std::string(dtype_name(p.dtype));
  e.tp_shapes = std::vector<std::vector<int64_t>>{p.shape};
  for (const auto& s : states) e.states[s] = {"zero/" + param_folder(p.name) + "/" + s + ".pt", std::nullopt};
  e.step = step;
  return e;
}

ValuePtr stored_extra_state_objects(const Checkpoint& ck) {
  auto objects = Value::dict();
  for (const auto& k : ck.keys()) {
    if (k.kind != KeyKind::Object || k.object.find("_extra_state") == std::string::npos) continue;
    const auto b = ck.dcp().read_bytes(k.fqn);
    objects->set_item(k.fqn, Value::bytes(std::string(b.begin(), b.end())));
  }
  return objects;
}

formats::universal::UniversalManifest torch_dist_manifest(const TorchDistStates& td) {
  formats::universal::UniversalManifest m;
  const std::vector<std::string> states = td.states();
  for (const auto& p : td.plan().params) m.params.push_back(torch_dist_entry(p, states, td.has_optimizer() && td.step()));
  m.source = td.plan().source;
  m.patterns_origin = "none (Megatron-Core torch_dist: global tensors)";
  m.patterns_set = nlohmann::json::object();
  return m;
}

RunSummary run_union_torch_dist(const std::string& input, const std::string& output, const ConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  Reporter::Phase phase(options.reporter, "plan");
  if (!options.patterns_file.empty())
    throw UsageError("--patterns " + options.patterns_file + ": " + input +
                     " is a Megatron-Core torch_dist checkpoint, which stores global tensors: there are no TP slices to join");
  refuse_output_over_input(output, "--output", input, "--input");
  std::unique_ptr<TorchDistStates> td;
  failed.guard([&] { td = std::make_unique<TorchDistStates>(input); });
  failed.settle("another MPI rank failed while planning");
  const TorchDistPlan& plan = td->plan();
  const Checkpoint* ck = &td->checkpoint();

  const std::vector<std::string> states = td->states();
  const ValuePtr& step = td->step();
  UnionJob job;
  job.params = plan.params.size();
  job.folders = {"zero", "megatron_core"};
  job.bytes = [&](size_t i) { return plan.params[i].bytes; };
  job.write_param = [&](size_t i, const fs::path& zero_dir) {
    const TorchDistParam& p = plan.params[i];
    ParamResult r;
    const fs::path dir = zero_dir / param_folder(p.name);
    make_folder(dir);
    auto& e = r.manifest;
    e = torch_dist_entry(p, states, td->has_optimizer() && step);
    for (const auto& state : states) {
      const Tensor value = td->read(i, state);
      r.bytes_read += value.nbytes();
      write_state_file(dir, state, value, r);
    }
    if (e.step) write_step_file(dir, step, r);
    return r;
  };
  job.write_common = [&](const fs::path& staged, formats::universal::UniversalManifest& manifest, CommonFiles& t) {
    auto opt_root = Value::dict();
    opt_root->set_item("param_groups", Value::list(td->groups()));
    std::vector<std::string> side = {(staged / formats::universal::kUniversalOptimizerState).string(),
                                     (staged / kMcoreCommonStateFile).string(), (staged / kMcoreObjectsFile).string()};
    save_torch_file(side[0], opt_root);
    save_torch_file(side[1], td->common());
    save_torch_file(side[2], stored_extra_state_objects(*ck));  // written back unchanged
    const formats::universal::UniversalManifest m = torch_dist_manifest(*td);
    manifest.source = m.source;
    manifest.patterns_origin = m.patterns_origin;
    manifest.patterns_set = m.patterns_set;
    for (const auto& s : side) t.bytes_written += file_size_or_zero(s);
    t.files += side.size();
  };
  return execute_union(job, output, options, failed, phase, t0);
}

namespace {
[[maybe_unused]] const bool kFromTorchDistRegistered =
    register_union(std::string(formats::kTorchDist), run_union_torch_dist,
                   [](const std::string& input, const ConvertOptions&) { return dcp_union_counts(dcp_plan_of_torch_dist(input)); });
}  // namespace

}  // namespace ucpkit::to_universal
