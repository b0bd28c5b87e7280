// DCP -> universal form (from_dcp.h). The mapping, with the torch 2.6 sources it follows
// (docs/formats-dcp.md, "Into the universal form"):
//  * keys: what each key holds is formats/dcp/state_keys' (planner_data paths, get_state_dict's
//    optimizer layout keyed by parameter fqn, with the torch lines);
//  * a model tensor (path without an "optim"/"optimizer" head; a leading "model" component is the
//    usual {"model": ..., "optim": ...} wrapper and is dropped) is a parameter, its tensor the
//    universal "fp32" state (the stored dtype kept: no conversion);
//  * optim.state.<fqn>.<name> tensors are the states <name> of parameter <fqn> (exp_avg, exp_avg_sq as
//    DeepSpeed's universal form names Adam's; any other name carried under its own), "step" its
//    zero/<param>/step.pt (the value as stored: a 0-d tensor since torch 1.12's Adam, or an int);
//  * optim.param_groups.<i>.<key> bytes items (torch.save of each value, default_planner.py:146-148)
//    become zero/optimizer_state.pt {"param_groups": [{key: value, ...}, ...]}, as DeepSpeed's
//    universal optimizer_state.pt carries param_groups; "params" lists fqns (state_dict.py:784-785).
//  * every other bytes entry (LR scheduler, dataloader position, train_state bytes, torchtitan's
//    flattened param_groups.<fqn>.<key>, any torch.save'd value) is carried verbatim, items/<n>.pt
//    under the manifest's "items" with its key and nested path;
//  * a 16-bit float model tensor or optimizer state (bf16 training, a bf16 model-only save) is widened
//    to float32 in its state file (exact) and its dtype recorded (states' source_dtype): the universal
//    form's states are float32, and ucp-load --format dcp narrows them back (bit for bit);
//  * where an entry's key differs from get_state_dict's (what ucp-load --format dcp writes by default:
//    torchtitan's top-level model keys and optimizer.*, train_state.step beside the model), the saved
//    path is recorded in source.dcp.keys, with the key layout (formats/dcp/key_record.h).
#include "to_universal/from_dcp.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/staging.h"
#include "formats/detect.h"
#include "formats/dcp/key_record.h"
#include "formats/dcp/reader.h"
#include "formats/dcp/state_keys.h"
#include "formats/universal/manifest.h"
#include "formats/universal/state_file.h"
#include "to_universal/union_executor.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "parallel/staging.h"
#include "parallel/threads.h"
#include "to_universal/from_torch_dist.h"
#include "to_universal/plan.h"
#include "to_universal/save.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {

using formats::dcp::Entry;
using formats::dcp::Folder;
using formats::dcp::FolderKind;
using formats::dcp::KeyRole;
using formats::dcp::Metadata;
using pickle::Value;
using pickle::ValuePtr;

namespace {

uint64_t entry_bytes(const Entry& e) { return static_cast<uint64_t>(numel_of(e.size)) * dtype_size(e.dtype); }

// The bytes of a fqn's items (what reading it costs).
uint64_t item_bytes(const Metadata& md, const std::string& fqn) {
  uint64_t n = 0;
  for (size_t k : md.items_of(fqn)) n += md.items[k].storage.length;
  return n;
}

// source.dcp.keys: the saved path of every carried entry whose key (or, when the planner recorded paths,
// whose path) is not what ucp-load --format dcp writes by default.
nlohmann::json saved_keys(const DcpPlan& plan, const Metadata& md) {
  nlohmann::json keys = nlohmann::json::object();
  auto keep = [&](const formats::dcp::KeyPath& def, const std::string& fqn) {
    const formats::dcp::KeyPath saved = formats::dcp::recorded_path(md, fqn);
    if (fqn != formats::dcp::flat_key(def) || (md.has_planner_data() && saved != def))
      formats::dcp::record_key(keys, def, saved);
  };
  for (const DcpParam& p : plan.params) {
    for (const auto& [state, fqn] : p.states)
      keep(state == "fp32" ? formats::dcp::model_key_path(p.name) : formats::dcp::state_key_path(p.name, state), fqn);
    if (!p.step.empty()) keep(formats::dcp::state_key_path(p.name, "step"), p.step);
  }
  for (const DcpBuffer& b : plan.buffers) keep(formats::dcp::model_key_path(b.name), b.fqn);
  for (const auto& [fqn, at] : plan.param_groups) keep(formats::dcp::group_key_path(at.first, at.second), fqn);
  return keys;
}

}  // namespace

DcpPlan plan_dcp(const Metadata& md, const Folder& folder) {
  DcpPlan plan;
  std::map<std::string, size_t> index;  // param name -> position in plan.params
  std::vector<std::pair<const Entry*, KeyRole>> states;
  for (const Entry& e : md.entries) {
    if (!e.is_bytes) formats::dcp::check_chunks_cover(e, md.path);
    const KeyRole r = formats::dcp::key_role(formats::dcp::nested_path(md, e.fqn));
    if (r.kind == KeyRole::Model && !e.is_bytes) {
      if (!index.emplace(r.param, plan.params.size()).second)
        fail(md.path, "DCP: two model tensors are both named '" + escaped_brief(r.param) + "' ('" + escaped_brief(e.fqn) + "')");
      DcpParam p;
      p.name = r.param;
      p.states["fp32"] = e.fqn;
      p.shape = e.size;
      p.dtype = e.dtype;
      p.bytes = entry_bytes(e);
      plan.params.push_back(std::move(p));
    } else if (r.kind == KeyRole::OptimizerState && (!e.is_bytes || r.name == "step")) {
      states.push_back({&e, r});
    } else if (r.kind == KeyRole::ParamGroup && e.is_bytes) {
      plan.param_groups.push_back({e.fqn, {r.group, r.name}});
    } else if (e.is_bytes) {
      plan.items.push_back({e.fqn, formats::dcp::recorded_path(md, e.fqn), item_bytes(md, e.fqn)});
    } else {
      plan.not_carried.push_back(e.fqn);
    }
  }
  for (const auto& [e, r] : states) {
    plan.optimizer = true;
    auto it = index.find(r.param);
    if (it == index.end())
      fail(md.path, "DCP: optimizer state '" + escaped_brief(e->fqn) + "' of parameter '" + escaped_brief(r.param) +
                        "', which has no model tensor in the checkpoint");
    DcpParam& p = plan.params[it->second];
    if (r.name == "step") {
      p.step = e->fqn;
      continue;
    }
    if (r.name == "fp32" || p.states.count(r.name))
      fail(md.path, "DCP: optimizer state '" + escaped_brief(e->fqn) + "' would overwrite the parameter's " + r.name + " state");
    if (e->size != p.shape)
      fail(md.path, "DCP: optimizer state '" + escaped_brief(e->fqn) + "' has shape " + shape_str(e->size) +
                        ", its parameter " + shape_str(p.shape) + " (the universal form holds full-shape states)");
    p.states[r.name] = e->fqn;
    p.bytes += entry_bytes(*e);
  }
  // Model tensors without optimizer state beside parameters with it are buffers (BatchNorm's running
  // statistics, counters, masks); in a model-only save only a dtype no parameter has (int, bool) tells
  // one. Each is carried as it is, in its own dtype (dropping or converting one changes the
  // resumed run).
  std::vector<DcpParam> params;
  for (auto& p : plan.params) {
    const bool buffer = plan.optimizer ? p.states.size() == 1 && p.step.empty() : !dtype_is_floating(p.dtype);
    if (buffer) plan.buffers.push_back({p.name, p.states.at("fp32"), p.shape, p.dtype, p.bytes});
    else params.push_back(std::move(p));
  }
  plan.params = std::move(params);
  plan.source.format = "dcp";
  auto& facts = plan.source.facts["dcp"] = {{"folder", formats::dcp::folder_kind_name(folder.kind)},
                                            {"era", formats::dcp::era_name(md.era)},
                                            {"world_size", formats::dcp::world_size_of(md, folder)},
                                            {"entries", md.entries.size()},
                                            {"items", md.items.size()},
                                            {"not_carried", plan.not_carried.size()}};
  // Written only when a key is not get_state_dict's: a folder made from such a DCP keeps its bytes.
  if (nlohmann::json keys = saved_keys(plan, md); !keys.empty()) {
    facts["layout"] = formats::dcp::key_layout(md).layout;
    facts["keys"] = std::move(keys);
  }
  return plan;
}

namespace {

// The step as stored: a tensor item, or a bytes item holding torch.save(int).
ValuePtr read_step(const formats::dcp::Reader& reader, const std::string& fqn) {
  const Entry* e = reader.metadata().find(fqn);
  if (e && !e->is_bytes) return Value::of_tensor(reader.read_tensor(fqn));
  return reader.read_object(fqn);
}

ParamResult convert_param(const DcpParam& p, const formats::dcp::Reader& reader, const fs::path& zero_dir) {
  ParamResult r;
  const std::string folder = param_folder(p.name);
  const fs::path dir = zero_dir / folder;
  make_folder(dir);
  formats::universal::UniversalParam& e = r.manifest;
  e.name = p.name;
  e.shape = p.shape;
  e.dtype = std::string(dtype_name(p.dtype));
  e.tp_shapes = std::vector<std::vector<int64_t>>{p.shape};
  for (const auto& [state, fqn] : p.states) {
    check_interrupted();
    formats::universal::StateFile f;
    const DType stored = reader.metadata().find(fqn)->dtype;
    const bool widen = stored == DType::BFloat16 || stored == DType::Float16;
    // Streamed: the chunks' bytes go from the mapped items through the writer's window into the file
    // (one copy, the CRC-32s computed on the window), never assembled in memory. A 16-bit float is read
    // whole and widened: every reader of the universal form reads float32 states.
    f.param = widen ? reader.read_tensor(fqn).to(DType::Float32) : reader.stream_tensor(fqn);
    r.bytes_read += item_bytes(reader.metadata(), fqn);
    const std::string path = (dir / (state + ".pt")).string();
    save_torch_file(path, formats::universal::to_pickle(f));
    r.bytes_written += file_size_or_zero(path);
    ++r.files;
    e.states[state] = {"zero/" + folder + "/" + state + ".pt", written_crc32(path, f.param)};
    if (widen) e.states[state].source_dtype = std::string(dtype_name(stored));
  }
  if (!p.step.empty()) {
    const std::string path = (dir / "step.pt").string();
    save_torch_file(path, read_step(reader, p.step));
    r.bytes_read += item_bytes(reader.metadata(), p.step);
    r.bytes_written += file_size_or_zero(path);
    ++r.files;
    e.step = true;
  }
  return r;
}

// zero/<folder>/fp32.pt of a buffer: its tensor as stored (the universal form's "fp32" file holds the
// model tensor in its own dtype, as a DCP parameter's does), listed under the manifest's "buffers".
formats::universal::UniversalBuffer convert_buffer(const DcpBuffer& b, const formats::dcp::Reader& reader,
                                                   const fs::path& zero_dir, CommonFiles& t) {
  check_interrupted();
  const std::string folder = param_folder(b.name);
  make_folder(zero_dir / folder);
  formats::universal::StateFile f;
  f.param = reader.stream_tensor(b.fqn);
  t.bytes_read += item_bytes(reader.metadata(), b.fqn);
  const std::string path = (zero_dir / folder / "fp32.pt").string();
  save_torch_file(path, formats::universal::to_pickle(f));
  t.bytes_written += file_size_or_zero(path);
  ++t.files;
  return {b.name, b.shape, std::string(dtype_name(b.dtype)), {"zero/" + folder + "/fp32.pt", written_crc32(path, f.param)}};
}

// items/<n>.pt: the bytes entry as stored (a torch.save stream, loaded by whoever saved it), listed
// under the manifest's "items" with its key and path.
formats::universal::UniversalItem convert_item(const DcpItem& item, size_t n, const formats::dcp::Reader& reader,
                                               const fs::path& staged, CommonFiles& t) {
  check_interrupted();
  const std::vector<uint8_t> bytes = reader.read_bytes(item.fqn);
  t.bytes_read += item.bytes;
  const std::string rel = std::string(formats::universal::kUniversalItemsFolder) + "/" + std::to_string(n) + ".pt";
  write_file_atomic((staged / rel).string(), {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  t.bytes_written += bytes.size();
  ++t.files;
  return {item.fqn, item.path, {rel, crc32_update(0, {bytes.data(), bytes.size()})}};
}

// zero/optimizer_state.pt: {"param_groups": [{key: value}, ...]} from the bytes items.
ValuePtr optimizer_state(const DcpPlan& plan, const formats::dcp::Reader& reader) {
  std::map<size_t, ValuePtr> groups;
  for (const auto& [fqn, at] : plan.param_groups) {
    auto& g = groups[at.first];
    if (!g) g = Value::dict();
    g->set_item(at.second, reader.read_object(fqn));
  }
  std::vector<ValuePtr> list;
  size_t want = 0;
  for (auto& [i, g] : groups) {
    if (i != want) fail(reader.metadata().path, "DCP: optimizer param_groups " + std::to_string(want) + " missing");
    ++want;
    list.push_back(g);
  }
  auto root = Value::dict();
  root->set_item("param_groups", Value::list(std::move(list)));
  return root;
}

}  // namespace

UnionCounts dcp_union_counts(const DcpPlan& plan) {
  UnionCounts c;
  c.params = plan.params.size();
  for (const auto& p : plan.params) c.bytes += p.bytes, c.atomic_files += p.states.size() + (p.step.empty() ? 0 : 1);
  for (const auto& b : plan.buffers) c.bytes += b.bytes, ++c.atomic_files;
  for (const auto& i : plan.items) c.bytes += i.bytes;
  c.files = "manifest.json, zero/optimizer_state.pt";
  c.from = "the DCP checkpoint";
  c.input_kind = "dcp";
  return c;
}

RunSummary run_union_dcp(const std::string& input, const std::string& output, const ConvertOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  auto& mpi = parallel::MpiSession::get();
  parallel::RankFailure failed(mpi);
  Reporter::Phase phase(options.reporter, "plan");
  const Folder folder = formats::dcp::find_folder(input);
  if (!options.patterns_file.empty())
    throw UsageError("--patterns " + options.patterns_file + ": " + input +
                     " is a DCP checkpoint, which stores global tensors: there are no TP slices to join");
  refuse_output_over_input(output, "--output", input, "--input");
  std::unique_ptr<formats::dcp::Reader> reader;
  DcpPlan plan;
  failed.guard([&] {
    Metadata md = formats::dcp::read_folder_metadata(folder);
    plan = plan_dcp(md, folder);
    reader = std::make_unique<formats::dcp::Reader>(folder.dir, std::move(md));
  });
  failed.settle("another MPI rank failed while planning");
  if (!plan.not_carried.empty()) {
    // Said by default (a resumed run without its scheduler or data position is another run).
    std::string names;
    for (size_t k = 0; k < plan.not_carried.size() && k < 4; ++k)
      names += (k ? "', '" : "'") + escaped_brief(plan.not_carried[k]);
    options.reporter.warning(std::to_string(plan.not_carried.size()) + " DCP tensors of " + input +
                             " are neither model tensors nor optimizer states of a parameter and are not carried "
                             "into the universal form (" + names + "'" + (plan.not_carried.size() > 4 ? ", ..." : "") +
                             "); ucp-load --input <the DCP> --format dcp keeps them");
  }

  UnionJob job;
  job.params = plan.params.size();
  job.bytes = [&](size_t i) { return plan.params[i].bytes; };
  job.write_param = [&](size_t i, const fs::path& zero_dir) { return convert_param(plan.params[i], *reader, zero_dir); };
  job.write_common = [&](const fs::path& staged, formats::universal::UniversalManifest& manifest, CommonFiles& t) {
    const std::string opt = (staged / formats::universal::kUniversalOptimizerState).string();
    save_torch_file(opt, optimizer_state(plan, *reader));
    t.bytes_written += file_size_or_zero(opt);
    ++t.files;
    // Rank 0 writes the buffers: small beside the parameters, and their manifest entries stay here.
    for (const DcpBuffer& b : plan.buffers) manifest.buffers.push_back(convert_buffer(b, *reader, staged / "zero", t));
    if (!plan.items.empty()) make_folder(staged / formats::universal::kUniversalItemsFolder);
    for (size_t k = 0; k < plan.items.size(); ++k) manifest.items.push_back(convert_item(plan.items[k], k, *reader, staged, t));
    manifest.source = plan.source;
    manifest.patterns_origin = "none (DCP: global tensors)";
    manifest.patterns_set = nlohmann::json::object();
  };
  RunSummary summary = execute_union(job, output, options, failed, phase, t0);
  summary.buffers = plan.buffers.size();
  summary.items = plan.items.size();
  summary.not_carried = plan.not_carried;
  return summary;
}

namespace {
[[maybe_unused]] const bool kFromDcpRegistered =
    register_union(std::string(formats::kDcp), run_union_dcp, [](const std::string& input, const ConvertOptions&) {
      const Folder folder = formats::dcp::find_folder(input);
      return dcp_union_counts(plan_dcp(formats::dcp::read_folder_metadata(folder), folder));
    });
}  // namespace

}  // namespace ucpkit::to_universal
