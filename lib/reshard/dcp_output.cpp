// ucp-load --format dcp (dcp_output.h): the state dict's entries in torch's order, each tensor read
// whole from the universal reader (one at a time) and written through formats/dcp/writer.
#include "reshard/dcp_output.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <unordered_map>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/crc32.h"
#include "core/error.h"
#include "formats/dcp/key_record.h"
#include "formats/dcp/writer.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"
#include "reshard/output_writer.h"
#include "reshard/target_defaults.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

using formats::dcp::Entry;
using pickle::Value;
using pickle::ValuePtr;

namespace {

std::string flat_of(const std::vector<ValuePtr>& parts) {
  std::string s;
  for (const auto& p : parts) {
    if (!s.empty()) s += '.';
    s += p->is(pickle::Kind::Int) ? std::to_string(p->i) : p->s;
  }
  return s;
}

// The source's param_groups list (the common optimizer state's), or null.
ValuePtr param_groups_of(const ModelInfo& model) {
  const ValuePtr& osd = model.optimizer_state;
  if (!osd || !osd->is(pickle::Kind::Dict)) return nullptr;
  ValuePtr pg = osd->get("param_groups");
  return pg && pg->is_sequence() ? pg : nullptr;
}

// torch.save(v) as bytes, through a scratch file in `dir`.
std::vector<uint8_t> torch_save_bytes(const ValuePtr& v, const fs::path& dir) {
  const std::string tmp = (dir / ".ucp-load-bytes-item").string();
  save_torch_file(tmp, v);
  std::ifstream in(tmp, std::ios::binary);
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw Error(tmp + ": read failed");
  fs::remove(tmp);
  return b;
}

// The value of a param_groups entry: the group's own value, or (params) the list of its fqns.
ValuePtr group_value(const ModelInfo& model, const ValuePtr& groups, const DcpSource& s) {
  if (s.key != "params") return groups->items[s.group]->at(s.key);
  std::vector<ValuePtr> names;
  for (const auto& p : model.params)
    if (static_cast<size_t>(p.group) == s.group) names.push_back(Value::str(p.name));
  return Value::list(std::move(names));
}


}  // namespace

DType state_dtype(const ParamInfo& p, const std::string& state) {
  const auto it = p.source_dtypes.find(state);
  return it == p.source_dtypes.end() ? DType::Float32 : it->second;
}

std::vector<uint8_t> read_item(const std::string& dir, const formats::universal::UniversalItem& item, bool verify) {
  const std::string manifest = (fs::path(dir) / formats::universal::kUniversalManifestName).string();
  const std::string path = confined_path(dir, item.file.file, manifest, "item " + item.key + " file").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot read (the universal checkpoint is incomplete?)");
  std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read failed");
  if (verify && item.file.crc32 && crc32_update(0, {b.data(), b.size()}) != *item.file.crc32)
    fail(path, "checksum mismatch (item " + escaped_brief(item.key) + ")");
  return b;
}

formats::dcp::Target dcp_target(int64_t world_size) {
  return world_size > 1 ? formats::dcp::Target::rows(world_size) : formats::dcp::Target::whole();
}

DcpOutput plan_dcp_output(const ModelInfo& model, DType dtype, const formats::dcp::Target& target,
                          const std::function<ValuePtr(int)>& step, bool own_dtypes) {
  DcpOutput out;
  out.target = target;
  out.dtype = dtype;
  out.optimizer_dtype = optimizer_dtype_name(model);
  out.own_dtypes = own_dtypes;
  std::vector<Entry> entries;
  std::vector<std::pair<std::string, formats::dcp::KeyPath>> paths;  // planner_data: {flat fqn: nested path}
  std::unordered_map<std::string, size_t> planned;                   // fqn -> its place in `paths`
  // Each entry under the key the source saved it with (a DCP source's record), else get_state_dict's.
  auto add = [&](const formats::dcp::KeyPath& default_path, DcpSource s, bool is_bytes, DType dt,
                 std::vector<int64_t> size) {
    formats::dcp::KeyPath saved = formats::dcp::saved_path(model.dcp_keys, default_path);
    Entry e;
    e.fqn = flat_of(formats::dcp::pickle_path(saved));
    e.is_bytes = is_bytes;
    e.dtype = dt;
    e.size = std::move(size);
    if (auto [it, fresh] = planned.emplace(e.fqn, paths.size()); fresh)  // a later path replaces an earlier one
      paths.emplace_back(e.fqn, std::move(saved));
    else paths[it->second].second = std::move(saved);
    entries.push_back(std::move(e));
    out.sources.push_back(std::move(s));
  };
  for (size_t i = 0; i < model.params.size(); ++i)
    add(formats::dcp::model_key_path(model.params[i].name), {DcpSource::Model, static_cast<int>(i)}, false,
        own_dtypes ? state_dtype(model.params[i], "fp32") : dtype, model.params[i].shape);
  for (size_t b = 0; b < model.buffers.size(); ++b)
    add(formats::dcp::model_key_path(model.buffers[b].name), {DcpSource::Buffer, static_cast<int>(b)}, false,
        *dtype_from_name(model.buffers[b].dtype), model.buffers[b].shape);
  for (size_t i = 0; i < model.params.size(); ++i) {
    const auto& p = model.params[i];
    if (const ValuePtr v = p.step ? step(static_cast<int>(i)) : nullptr) {
      const bool tensor = v->is(pickle::Kind::Tensor);
      add(formats::dcp::state_key_path(p.name, "step"), {DcpSource::Step, static_cast<int>(i)}, !tensor,
          tensor ? v->as_tensor().dtype() : DType::Float32, tensor ? v->as_tensor().shape() : std::vector<int64_t>{});
    }
    for (const auto& s : model.states)
      if (s != "fp32")
        add(formats::dcp::state_key_path(p.name, s), {DcpSource::State, static_cast<int>(i), s}, false, state_dtype(p, s), p.shape);
  }
  if (const ValuePtr groups = param_groups_of(model)) {
    for (size_t g = 0; g < groups->items.size(); ++g) {
      const ValuePtr& group = groups->items[g];
      if (!group->is(pickle::Kind::Dict)) throw Error("the optimizer state's param_groups " + std::to_string(g) + " is not a dict");
      std::vector<std::string> keys;
      for (const auto& kv : group->entries)
        if (kv.first->is(pickle::Kind::Str) && kv.first->s != "params") keys.push_back(kv.first->s);
      keys.push_back("params");
      for (const auto& k : keys)
        add(formats::dcp::group_key_path(g, k), {DcpSource::ParamGroup, -1, "", g, k}, true, DType::Float32, {});
    }
  }
  // A DCP source's other bytes entries, verbatim under their own paths (not get_state_dict's: no record).
  for (size_t k = 0; k < model.items.size(); ++k)
    add(model.items[k].path, {DcpSource::Item, static_cast<int>(k)}, true, DType::Float32, {});
  auto planner = std::make_shared<formats::dcp::PlannerPaths>();
  std::vector<formats::dcp::PlannerPaths::Part> parts;
  for (const auto& [flat, path] : paths) {
    parts.clear();
    for (const auto& p : path)
      parts.push_back(p.is_string() ? formats::dcp::PlannerPaths::Part{p.get_ref<const std::string&>(), 0, false}
                                    : formats::dcp::PlannerPaths::Part{{}, p.get<int64_t>(), true});
    planner->add(flat, parts);
  }
  out.planner = std::move(planner);
  out.plan = formats::dcp::make_save_plan(entries, target);
  return out;
}

std::string optimizer_dtype_name(const ModelInfo& model) {
  std::set<std::string> names;
  for (const auto& p : model.params)
    for (const auto& s : model.states)
      if (s != "fp32") names.insert(dtype_option_name(state_dtype(p, s)));
  return names.empty() ? "fp32" : names.size() == 1 ? *names.begin() : "as stored";
}

nlohmann::json dcp_target_json(const formats::dcp::Target& target, DType dtype, const std::string& optimizer_dtype) {
  // dcp_target's two meshes (save_plan's other kinds have no ucp-load option).
  const bool rows = target.kind == formats::dcp::Target::Kind::Rows;
  return {{"dtype", dtype_option_name(dtype)},
          {"optimizer_dtype", optimizer_dtype},
          {"mesh", rows ? "rows" : "whole"},
          {"world", target.world}};
}

nlohmann::json save_plan_description(const formats::dcp::SavePlan& plan) {
  nlohmann::json j;
  size_t tensors = 0, chunks = 0;
  for (const auto& e : plan.entries)
    if (!e.is_bytes) ++tensors, chunks += e.chunks.size();
  j["entries"] = plan.entries.size();
  j["tensor_entries"] = tensors;
  j["items"] = chunks + (plan.entries.size() - tensors);
  auto& files = j["files"] = nlohmann::json::array();
  for (const auto& f : plan.files) files.push_back({{"file", f.relative_path}, {"rank", f.rank}, {"items", f.items.size()}});
  files.push_back({{"file", ".metadata"}});
  j["plan"] = nlohmann::json::parse(formats::dcp::plan_json(plan));
  return j;
}

nlohmann::json dcp_output_json(const DcpOutput& out) {
  nlohmann::json j;
  j["format"] = "dcp";
  j["dtype"] = dtype_option_name(out.dtype);
  j["target"] = dcp_target_json(out.target, out.dtype, out.optimizer_dtype);
  if (out.own_dtypes) j["dtype"] = j["target"]["dtype"] = "as stored";
  j.update(save_plan_description(out.plan));
  return j;
}

DcpWritten write_dcp_output(const DcpOutput& out, const ModelInfo& model, UniversalReader& reader,
                            const std::string& dir, const std::string& checkpoint_id) {
  std::map<std::string, size_t> index;
  for (size_t k = 0; k < out.plan.entries.size(); ++k) index[out.plan.entries[k].fqn] = k;
  const ValuePtr groups = param_groups_of(model);
  auto whole = [&](const Entry& e) -> Tensor {
    const DcpSource& s = out.sources.at(index.at(e.fqn));
    if (s.kind == DcpSource::Model) return read_whole_tensor(model, reader, s.param, "fp32", e.dtype);
    if (s.kind == DcpSource::State) return read_whole_tensor(model, reader, s.param, s.state, e.dtype);
    if (s.kind == DcpSource::Buffer) return read_buffer(reader.dir(), model.buffers.at(s.param), reader.verifying());
    const ValuePtr v = reader.step(s.param);  // Step as a tensor
    if (!v || !v->is(pickle::Kind::Tensor)) throw Error(model.params[s.param].name + ": its step changed while writing");
    return v->as_tensor().contiguous(true);
  };
  auto bytes = [&](const Entry& e) -> std::vector<uint8_t> {
    const DcpSource& s = out.sources.at(index.at(e.fqn));
    if (s.kind == DcpSource::Item) return read_item(reader.dir(), model.items.at(s.param), reader.verifying());
    const ValuePtr v = s.kind == DcpSource::Step ? reader.step(s.param) : group_value(model, groups, s);
    return torch_save_bytes(v, dir);
  };
  formats::dcp::WriteOptions wo;
  wo.durable = false;  // the caller's staging folder is flushed at its commit
  wo.planner = out.planner;
  const fs::path inner = fs::path(dir) / ".dcp";
  const auto result = formats::dcp::write_dcp(out.plan, formats::dcp::chunks_of_whole(whole, bytes), inner.string(), wo);
  DcpWritten w;
  for (const auto& f : out.plan.files) {
    fs::rename(inner / f.relative_path, fs::path(dir) / f.relative_path);
    ++w.files;
  }
  fs::remove(inner / ".metadata");
  fs::remove(inner);
  // StorageMeta.checkpoint_id names the final folder, not the staging one.
  const std::string md = formats::dcp::metadata_pickle(out.plan, result, wo, checkpoint_id);
  write_file_atomic((fs::path(dir) / ".metadata").string(), md);
  w.bytes = result.bytes + md.size();
  w.files += 1;
  w.items = result.storage.size();
  return w;
}


namespace {

// The plan of the output, with each parameter's step read (its kind decides the entry's).
DcpOutput dcp_output_of(const LoadOptions& options, const Prepared& p, UniversalReader& reader) {
  return plan_dcp_output(p.model, p.plan.target.dtype, dcp_target(options.given.world_size),
                         [&](int i) { return reader.step(i); }, keeps_stored_dtypes(options.given, p.model, options.format));
}

// --format dcp: global tensors (the parallel layout does not apply; --world-size N: FSDP2's rows);
// rank 0 writes the data files and .metadata.
class DcpOutputWriter final : public OutputWriter {
 public:
  bool takes_layout_options() const override { return false; }
  std::string why_no_layout() const override {
    return " (a DCP checkpoint holds global tensors; --world-size N shards them over N ranks)";
  }
  void prepare(const LoadOptions&, Prepared&) const override {}

  nlohmann::json plan_json(const LoadOptions& options, const Prepared& p) const override {
    UniversalReader reader(p.model, options.input, false);
    const auto source = open_plan_source(p, reader);
    auto j = dcp_output_json(dcp_output_of(options, p, reader));
    j["from_source"] = p.from_source;
    return j;
  }

  void write(LoadRun& r, const std::string& staged) const override {
    r.failed.guard([&] {
      if (r.mpi.rank() != 0) return;
      const DcpOutput out = dcp_output_of(r.options, r.prep, r.reader);
      const std::string id = fs::absolute(r.options.output).lexically_normal().string();
      const DcpWritten w = write_dcp_output(out, r.prep.model, r.reader, staged, id);
      r.written += w.bytes;
      r.files += w.files;
    });
  }

  void summarize(const LoadRun& r, LoadSummary& s) const override {
    s.target = dcp_target_json(dcp_target(r.options.given.world_size), r.prep.plan.target.dtype,
                               optimizer_dtype_name(r.prep.model));
    if (keeps_stored_dtypes(r.options.given, r.prep.model, r.options.format)) s.target["dtype"] = "as stored";
  }
};

[[maybe_unused]] const bool kDcpOutputRegistered = register_output_writer(OutputFormat::Dcp, std::make_shared<DcpOutputWriter>());

}  // namespace

}  // namespace ucpkit::reshard
