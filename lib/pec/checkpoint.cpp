// Checkpoint discovery for PEC (universal and native DeepSpeed MoE layouts).
#include "pec/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "core/registry.h"
#include "io/pickle/opcodes.h"
#include "io/torch/torch_file.h"
#include "formats/detect.h"
#include "formats/deepspeed/autoep_slices.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/moe.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "formats/universal/manifest.h"
#include "pec/autoep_zero3.h"
#include "pec/paths.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {

// Expert parameter names in a universal folder without manifest.json (ds_to_universal's), the only
// place a name has to say the layer: "...layers.<i>.<...>experts.[deepspeed_experts.|local_experts.]<j>.<...>".
const std::regex& expert_name_regex() {
  static const std::regex re(R"((?:^|\.)layers\.(\d+)\.(?:.*\.)?experts\.(?:deepspeed_experts\.|local_experts\.)?(\d+)\.)");
  return re;
}

void list_files(const fs::path& root, std::vector<std::string>& out) {
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), root).string();
    if (rel.find(".tmp.") != std::string::npos) continue;
    out.push_back(rel);
  }
  std::sort(out.begin(), out.end());
}

void finish_shape(SourceCheckpoint& c, const std::map<int, int>& max_expert) {
  c.shape.experts_per_layer.clear();
  int expect = 0;
  for (const auto& [l, e] : max_expert) {
    if (l != expect) fail(c.root, "MoE layer " + std::to_string(expect) + " has no experts");
    c.shape.experts_per_layer.push_back(e + 1);
    ++expect;
  }
  for (int l = 0; l < c.shape.num_layers(); ++l)
    for (int e = 0; e < c.shape.experts_per_layer[static_cast<size_t>(l)]; ++e)
      if (!c.experts.count({l, e})) fail(c.root, "expert " + std::to_string(e) + " of MoE layer " + std::to_string(l) + " is missing");
}

// zero/<param folder> -> (transformer layer, global expert) of a universal folder's expert parameters,
// from the manifest's native MoE entries (formats/universal/manifest.h).
std::map<std::string, std::pair<int, int>> experts_from_manifest(const formats::universal::UniversalManifest& m,
                                                                 const std::string& path) {
  std::map<std::string, std::pair<int, int>> out;
  for (const auto& p : m.params) {
    if (!p.expert) continue;
    if (p.expert->layer < 0 || p.expert->global_id < 0)
      fail(path, "expert parameter " + p.name + " has no transformer layer or global expert id");
    if (p.states.empty()) fail(path, "expert parameter " + p.name + " has no state files");
    // Its folder: zero/<param folder>/<state>.pt
    const fs::path file(p.states.begin()->second.file);
    auto it = file.begin();
    if (file.parent_path().parent_path() != "zero" || it == file.end() || ++it == file.end())
      fail(path, "expert parameter " + p.name + " has a state file outside zero/<param>/");
    out[it->string()] = {p.expert->layer, p.expert->global_id};
  }
  return out;
}

// The same from the folder names alone, for universal folders without a manifest (ds_to_universal's).
std::map<std::string, std::pair<int, int>> experts_from_names(const std::vector<std::string>& files) {
  std::map<std::string, std::pair<int, int>> out;
  for (const auto& rel : files) {
    fs::path p(rel);
    auto it = p.begin();
    if (it == p.end() || *it != "zero") continue;
    ++it;
    if (it == p.end()) continue;
    std::string param = it->string();
    if (out.count(param)) continue;
    std::smatch m;
    if (std::regex_search(param, m, expert_name_regex())) out[param] = {std::stoi(m[1]), std::stoi(m[2])};
    else if (formats::deepspeed::local_expert_index(param))
      fail("zero/" + param, "an expert parameter whose name has no layers.N, in a universal folder without " +
                                std::string(formats::universal::kUniversalManifestName) +
                                ": its MoE layer is unknown (make the folder with ucp-union, whose manifest records "
                                "each expert's MoE layer from the expert files, or give pec-save the native checkpoint)");
  }
  return out;
}

void open_universal(SourceCheckpoint& c, const OpenOptions& o) {
  c.layout = SourceLayout::Universal;
  std::vector<std::string> files;
  list_files(c.root, files);
  const fs::path manifest = fs::path(c.root) / formats::universal::kUniversalManifestName;
  const bool has_manifest = fs::exists(manifest);
  const std::map<std::string, std::pair<int, int>> param_expert =
      has_manifest ? experts_from_manifest(formats::universal::read_universal_manifest(manifest.string()), manifest.string())
                   : experts_from_names(files);
  // Transformer layer -> MoE layer index, in layer order.
  std::set<int> moe_layers;
  for (const auto& [param, le] : param_expert) moe_layers.insert(le.first);
  std::map<int, int> moe_index;
  for (int l : moe_layers) moe_index.emplace(l, static_cast<int>(moe_index.size()));
  std::map<int, int> max_expert;
  std::set<std::string> expert_folders;  // those holding files
  for (const auto& rel : files) {
    uint64_t size = fs::file_size(fs::path(c.root) / rel);
    c.file_sizes[rel] = size;
    fs::path p(rel);
    auto it = p.begin();
    std::string param;
    if (it != p.end() && *it == "zero" && ++it != p.end()) param = it->string();
    auto pe = param_expert.find(param);
    if (pe == param_expert.end() || fs::path(rel).parent_path().string() != "zero/" + param) {
      c.non_expert_files.push_back(rel);
      c.non_expert_bytes_total += size;
      continue;
    }
    int l = moe_index.at(pe->second.first), e = pe->second.second;
    max_expert[l] = std::max(max_expert[l], e);
    c.experts[{l, e}].push_back({rel, {}, size});
    c.expert_bytes_total += size;
    expert_folders.insert(param);
  }
  if (c.experts.empty()) fail(c.root, "no expert parameters under zero/ (is this an MoE universal checkpoint?)");
  for (const auto& [param, le] : param_expert)  // listed by the manifest but absent
    if (has_manifest && !expert_folders.count(param))
      fail(manifest.string(), "expert parameter folder zero/" + param + " has no files (incomplete universal checkpoint)");
  finish_shape(c, max_expert);
  c.shape.ep_size = o.ep_size > 0 ? o.ep_size : 1;
}

// Expert fragments of one optimizer file: (moe layer, global expert) -> ranges.
void slice_optimizer_file(SourceCheckpoint& c, const std::string& rel, int dp_rank, int dp_size, const OpenOptions& o,
                          const std::map<std::string, int>& stem_to_moe, const formats::deepspeed::AutoEpZero12Slicing& autoep,
                          std::map<std::pair<int, int>, std::vector<ByteRange>>& out) {
  const std::string path = (fs::path(c.root) / rel).string();
  auto mapped = MappedFile::open(path);
  if (!looks_like_zip(mapped->bytes())) fail(path, "legacy (non-zip) optimizer files are not supported by pec-save");
  auto records = read_zip_directory(mapped->bytes(), path);
  TorchFile tf = load_torch_file(path);
  const formats::deepspeed::OptimizerShard shard = formats::deepspeed::read_optimizer_shard(tf);
  if (shard.zero3()) fail(path, "optimizer shard lacks param_slice_mappings / fp32 groups / base state");
  const std::string prefix = tf.archive_prefix.empty() ? std::string() : tf.archive_prefix + "/";
  for (size_t g = 0; g < shard.groups.size(); ++g) {
    const auto& group = shard.groups[g];
    int ep = c.shape.ep_size;
    if (group.ep_size > 0) ep = group.ep_size;
    // The tensors whose partitions follow this group's slice mapping.
    std::vector<const Tensor*> tensors{&group.fp32};
    for (const char* s : {"exp_avg", "exp_avg_sq"})
      for (const auto& [m, t] : group.moments)
        if (m == s) tensors.push_back(&t);
    for (const auto& frag : group.fragments) {
      const std::string& name = frag.param;
      if (auto w = autoep.weights.find(name); w != autoep.weights.end()) {
        // Partition size: this rank's fp32 partition plus its recorded padding (only the last rank pads).
        const int64_t partition = group.fp32.numel() + std::max<int64_t>(group.padding, 0);
        const auto coords = formats::deepspeed::ep_coords(dp_rank, dp_size, ep, autoep.data_before_expert || o.data_before_expert);
        for (const auto& run : formats::deepspeed::autoep_zero12_fragment_runs(w->second, coords.ep_rank, coords.edp_rank, partition,
                                                                   frag.start, frag.numel, path, name))
          add_element_ranges(tensors, records, prefix, frag.start + run.offset, run.numel, path, name,
                             out[{w->second.moe_layer, run.global_expert}]);
        continue;
      }
      auto local = formats::deepspeed::local_expert_index(name);
      if (!local) continue;
      auto moe = stem_to_moe.find(formats::deepspeed::with_expert_index(name, 0));
      if (moe == stem_to_moe.end())
        fail(path, "expert parameter " + name + " is in no expert file (layer_<L>_expert_<E>_mp_rank_XX_model_states.pt)");
      int experts = c.shape.experts_per_layer.at(static_cast<size_t>(moe->second));
      int per_rank = experts / std::max(ep, 1);
      int ep_rank = formats::deepspeed::ep_coords(dp_rank, dp_size, ep, o.data_before_expert).ep_rank;
      int global = ep_rank * per_rank + *local;
      add_element_ranges(tensors, records, prefix, frag.start, frag.numel, path, name, out[{moe->second, global}]);
    }
  }
}

}  // namespace

namespace {

void open_native(SourceCheckpoint& c, const OpenOptions& o, const formats::deepspeed::DeepSpeedLayout& ds) {
  c.layout = SourceLayout::DeepSpeedMoe;
  if (ds.tp != 1 || ds.pp != 1) fail(c.root, "native DeepSpeed MoE with TP or PP > 1 is not supported by pec-save yet");
  c.shape.ep_size = o.ep_size > 0 ? o.ep_size : std::max(ds.ep, 1);
  std::vector<std::string> files;
  list_files(c.root, files);
  for (const auto& rel : files) c.file_sizes[rel] = fs::file_size(fs::path(c.root) / rel);
  std::map<int, int> max_expert;
  std::set<std::string> expert_files;
  // An expert parameter's MoE layer is the L of the expert file holding it (DeepSpeed's moe_layer_id,
  // the MoE modules' order: v0.19.6 engine.py:4961-4965, file name :5009-5013), whatever the blocks are
  // called (layers.N, blocks.N, h.N). One file per MoE layer gives the names, with the expert index
  // set to 0 (the optimizer shards name EP-local experts).
  std::map<std::string, int> stem_to_moe;
  std::set<int> looked_up;
  for (const auto& ef : ds.expert_files) {
    const std::string rel = fs::path(ef.path).filename().string();  // expert files lie in the step folder itself
    expert_files.insert(rel);
    max_expert[ef.moe_layer] = std::max(max_expert[ef.moe_layer], ef.expert);
    uint64_t size = c.file_sizes.at(rel);
    c.experts[{ef.moe_layer, ef.expert}].push_back({rel, {}, size});
    c.expert_bytes_total += size;
    if (!looked_up.insert(ef.moe_layer).second) continue;
    auto root = load_torch(fs::path(c.root) / rel);
    if (!root || root->kind != pickle::Kind::Dict) fail((fs::path(c.root) / rel).string(), "not an expert state dict");
    for (const auto& [k, v] : root->entries) {
      if (!k->is(pickle::Kind::Str)) continue;
      auto [it, fresh] = stem_to_moe.emplace(formats::deepspeed::with_expert_index(k->as_str(), 0), ef.moe_layer);
      if (!fresh && it->second != ef.moe_layer)
        fail((fs::path(c.root) / rel).string(), "parameter " + k->as_str() + " is also in the expert files of MoE layer " +
                                                    std::to_string(it->second));
    }
  }
  finish_shape(c, max_expert);
  // Expert fragments inside the optimizer shards.
  formats::deepspeed::AutoEpZero12Slicing autoep;
  if (!ds.model_files.empty()) {
    const std::string model = ds.model_files[0];  // already under c.root (formats::deepspeed::infer_layout joins it)
    autoep = formats::deepspeed::autoep_zero12_slicing(load_torch(model), model);
  }
  std::map<std::pair<int, int>, std::vector<ByteRange>> per_expert;
  for (size_t mp = 0; mp < ds.optim_files.size(); ++mp)
    for (size_t d = 0; d < ds.optim_files[mp].size(); ++d) {
      std::string rel = fs::path(ds.optim_files[mp][d]).filename().string();
      std::map<std::pair<int, int>, std::vector<ByteRange>> found;
      slice_optimizer_file(c, rel, static_cast<int>(d), ds.dp, o, stem_to_moe, autoep, found);
      for (auto& [key, ranges] : found) {
        ExpertPart part{rel, ranges, 0};
        for (const auto& r : ranges) part.bytes += r.length;
        auto& all = c.expert_ranges[rel];
        all.insert(all.end(), ranges.begin(), ranges.end());
        c.experts[key].push_back(part);
        c.expert_bytes_total += part.bytes;
      }
    }
  for (const auto& rel : files) {
    if (expert_files.count(rel)) continue;
    c.non_expert_files.push_back(rel);
    c.non_expert_bytes_total += c.stored_bytes(rel);
  }
}

// DeepSpeed AutoEP under ZeRO-3 (lib/pec/autoep_zero3.h): no expert files; every expert is its byte
// ranges inside the optimizer shards, which are stored with those ranges cut out (like native shards).
void open_autoep_zero3(SourceCheckpoint& c, const OpenOptions& o) {
  c.layout = SourceLayout::DeepSpeedAutoEpZero3;
  std::vector<std::string> files;
  list_files(c.root, files);
  for (const auto& rel : files) c.file_sizes[rel] = fs::file_size(fs::path(c.root) / rel);
  AutoEpZero3Experts z = autoep_zero3_experts(c.root);
  c.shape.ep_size = o.ep_size > 0 ? o.ep_size : z.ep_size;
  std::map<int, int> max_expert;
  for (auto& [rel, per_expert] : z.ranges) {
    if (!c.file_sizes.count(rel)) fail((fs::path(c.root) / rel).string(), "optimizer shard is not in the step folder");
    for (auto& [key, ranges] : per_expert) {
      ExpertPart part{rel, ranges, 0};
      for (const auto& r : ranges) part.bytes += r.length;
      auto& all = c.expert_ranges[rel];
      all.insert(all.end(), ranges.begin(), ranges.end());
      c.experts[key].push_back(std::move(part));
      c.expert_bytes_total += c.experts[key].back().bytes;
      max_expert[key.first] = std::max(max_expert[key.first], key.second);
    }
  }
  finish_shape(c, max_expert);
  for (size_t l = 0; l < z.experts_per_layer.size(); ++l)
    if (c.shape.experts_per_layer.at(l) != z.experts_per_layer[l])
      fail(c.root, "MoE layer " + std::to_string(l) + " has experts without bytes in the ZeRO-3 shards");
  for (const auto& rel : files) {
    c.non_expert_files.push_back(rel);
    c.non_expert_bytes_total += c.stored_bytes(rel);
  }
}

// A native or universal checkpoint: the tag folder itself, or its parent with `latest` (or
// `latest_universal`, written beside a universal copy) naming it.
std::string resolve_root(const std::string& path, std::string& tag, std::string& pointer_file) {
  namespace ds = formats::deepspeed;
  const auto t = ds::resolve_tag_folder(absolute_path(path), {ds::kLatestName, ds::kLatestUniversalName});
  tag = t.tag;
  pointer_file = t.pointer;
  return t.dir;
}

}  // namespace

uint64_t SourceCheckpoint::expert_bytes(int moe_layer, int expert) const {
  uint64_t n = 0;
  auto it = experts.find({moe_layer, expert});
  if (it != experts.end())
    for (const auto& p : it->second) n += p.bytes;
  return n;
}

uint64_t SourceCheckpoint::stored_bytes(const std::string& rel) const {
  uint64_t size = file_sizes.at(rel), sliced = 0;
  if (auto it = expert_ranges.find(rel); it != expert_ranges.end())
    for (const auto& r : it->second) sliced += r.length;  // disjoint: each byte belongs to one expert
  return size - sliced;
}

namespace {
SourceCheckpoint open_checkpoint_unchecked(const std::string& path, const OpenOptions& options);

// Every torch file stored whole (expert files, model states, universal state files) must be complete
// before it goes into the store: a zip whose directory is missing or whose records run past the end
// (a truncated copy, a save still being written) is refused, naming the file. Only the directory and
// the local headers are read (a few pages per file); the bytes themselves are not interpreted.
void check_whole_files(const SourceCheckpoint& c) {
  std::vector<std::string> files = c.non_expert_files;
  for (const auto& [key, parts] : c.experts)
    for (const auto& p : parts)
      if (p.ranges.empty()) files.push_back(p.path);
  for (const auto& rel : files) {
    if (c.expert_ranges.count(rel) || fs::path(rel).extension() != ".pt") continue;  // shards: parsed whole
    const std::string path = (fs::path(c.root) / rel).string();
    auto f = MappedFile::open(path);
    if (looks_like_zip(f->bytes())) {
      (void)read_zip_directory(f->bytes(), path);
    } else if (f->size() < 2 || f->data()[0] != pickle::op_byte(pickle::Op::PROTO)) {  // legacy torch.save: a pickle
      fail(path, "not a torch file (neither a zip archive nor a pickle; empty or truncated?)");
    }
  }
}
}  // namespace

SourceCheckpoint open_checkpoint(const std::string& path, const OpenOptions& options) {
  SourceCheckpoint c = open_checkpoint_unchecked(path, options);
  check_whole_files(c);
  return c;
}

namespace {
// A DeepSpeed checkpoint or a universal folder, told apart by what its root (through `latest` or
// `latest_universal`) holds.
void open_resolved(SourceCheckpoint& c, const std::string& path, const OpenOptions& options) {
  c.root = resolve_root(path, c.tag, c.pointer);
  if (fs::is_directory(fs::path(c.root) / "zero")) {
    open_universal(c, options);
    return;
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(c.root))
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  auto ds = formats::deepspeed::infer_layout(names, c.root);
  if (ds.expert_files.empty() && ds.zero3 && !ds.zero3_model_files.empty() && !ds.zero3_model_files[0].empty() &&
      is_autoep_zero3(ds.zero3_model_files[0][0])) {
    open_autoep_zero3(c, options);
    return;
  }
  if (ds.expert_files.empty()) fail(c.root, "no expert files (layer_<L>_expert_<E>_mp_rank_XX_model_states.pt): not an MoE checkpoint");
  open_native(c, options, ds);
}

// pec-save's inputs by folder kind (the open asks this table, it names no format).
using SourceOpener = void (*)(SourceCheckpoint&, const std::string& path, const OpenOptions&);
NamedTable<SourceOpener>& source_openers() {
  static NamedTable<SourceOpener> t;
  return t;
}
[[maybe_unused]] const bool kCheckpointRegistered = source_openers().set(std::string(formats::kDeepSpeed), open_resolved) &&
                                          source_openers().set(std::string(formats::kUniversal), open_resolved);

SourceCheckpoint open_checkpoint_unchecked(const std::string& path, const OpenOptions& options) {
  // DeepSpeed's own universal folders (ds_to_universal's, no manifest.json) carry no marker detect()
  // knows: a folder with zero/ is read as universal, as before; any other is asked.
  const std::string kind = fs::is_directory(fs::path(path) / "zero") ? std::string(formats::kUniversal) : formats::detect(path).format;
  const SourceOpener open = source_openers().find(kind);
  if (!open) fail(path, "a " + formats::detect(path).name() + " folder: pec-save reads a DeepSpeed checkpoint or a universal folder");
  SourceCheckpoint c;
  open(c, path, options);
  return c;
}
}  // namespace

std::span<const uint8_t> Blob::bytes() const {
  if (file) return file->bytes();
  return owned;
}

SourceSegments non_expert_segments(const SourceCheckpoint& c, const std::string& rel, std::optional<CutList>& cut) {
  SourceSegments s;
  s.path = (fs::path(c.root) / rel).string();
  cut.reset();
  const uint64_t size = c.file_sizes.count(rel) ? c.file_sizes.at(rel) : fs::file_size(s.path);
  auto it = c.expert_ranges.find(rel);
  if (it == c.expert_ranges.end()) {
    if (size) s.segments.emplace_back(0, size);
    s.size = size;
    return s;
  }
  auto f = MappedFile::open(s.path);  // the zip directory only (a few pages)
  if (f->size() != size) fail(s.path, "changed size while being saved");
  auto records = read_zip_directory(f->bytes(), f->path());
  std::vector<std::pair<uint64_t, uint64_t>> abs;
  for (const auto& r : it->second) abs.emplace_back(records.at(r.record).data_offset + r.offset, r.length);
  std::sort(abs.begin(), abs.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& [o, l] : abs) {
    if (l == 0) continue;
    if (!merged.empty() && o <= merged.back().first + merged.back().second)
      merged.back().second = std::max(merged.back().first + merged.back().second, o + l) - merged.back().first;
    else
      merged.emplace_back(o, l);
  }
  uint64_t pos = 0;
  for (const auto& [o, l] : merged) {
    if (o > pos) s.segments.emplace_back(pos, o - pos);
    pos = o + l;
  }
  if (size > pos) s.segments.emplace_back(pos, size - pos);
  for (const auto& [o, l] : s.segments) s.size += l;
  cut = CutList{size, std::move(merged)};
  return s;
}

SourceSegments expert_part_segments(const SourceCheckpoint& c, const ExpertPart& part) {
  SourceSegments s;
  s.path = (fs::path(c.root) / part.path).string();
  if (part.ranges.empty()) {
    const uint64_t size = fs::file_size(s.path);
    if (size) s.segments.emplace_back(0, size);
    s.size = size;
    return s;
  }
  auto f = MappedFile::open(s.path);
  auto records = read_zip_directory(f->bytes(), f->path());
  for (const auto& r : part.ranges) {
    const auto& pos = records.at(r.record);
    if (r.length) s.segments.emplace_back(pos.data_offset + r.offset, r.length);
    s.size += r.length;
  }
  return s;
}

namespace {
Blob read_segments(const SourceSegments& s) {
  Blob b;
  auto f = MappedFile::open(s.path);
  b.owned.reserve(s.size);
  for (const auto& [o, l] : s.segments) {
    if (o + l > f->size()) fail(s.path, "changed size while being saved");
    b.owned.insert(b.owned.end(), f->data() + o, f->data() + o + l);
  }
  return b;
}
}  // namespace

Blob read_non_expert(const SourceCheckpoint& c, const std::string& rel, std::optional<CutList>& cut) {
  auto s = non_expert_segments(c, rel, cut);
  if (!cut) {
    Blob b;
    b.file = MappedFile::open(s.path);
    return b;
  }
  return read_segments(s);
}

Blob read_expert_part(const SourceCheckpoint& c, const ExpertPart& part) {
  if (part.ranges.empty()) {
    Blob b;
    b.file = MappedFile::open((fs::path(c.root) / part.path).string());
    return b;
  }
  return read_segments(expert_part_segments(c, part));
}

void add_element_ranges(const std::vector<const Tensor*>& tensors, const std::map<std::string, ZipRecord>& records,
                        const std::string& prefix, int64_t elem, int64_t numel, const std::string& path,
                        const std::string& name, std::vector<ByteRange>& out) {
  for (const Tensor* t : tensors) {
    const auto& st = t->storage();
    auto rec = records.find(prefix + "data/" + st->key);
    if (rec == records.end()) fail(path, "no record for storage " + st->key);
    const uint64_t es = dtype_size(t->dtype());
    ByteRange r{rec->first, static_cast<uint64_t>(t->storage_offset() + elem) * es, static_cast<uint64_t>(numel) * es};
    if (r.offset + r.length > rec->second.size) fail(path, "fragment of " + name + " runs past its storage");
    out.push_back(r);
  }
}

nlohmann::json ranges_to_json(const std::vector<ByteRange>& rs) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& r : rs) a.push_back({r.record, r.offset, r.length});
  return a;
}

namespace {

// An offset, length or size of a manifest: a non-negative integer. get<uint64_t>() would take -1 as
// 2^64 - 1 and 1.5 as 1, a damaged entry as a huge range instead of a malformed one.
uint64_t byte_count(const nlohmann::json& v, const std::string& name, const char* what) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  fail(name, what);
}

}  // namespace

std::vector<ByteRange> ranges_from_json(const nlohmann::json& j, const std::string& name) {
  std::vector<ByteRange> out;
  try {
    if (!j.is_array()) fail(name, "malformed ranges: not a list");
    for (const auto& r : j) {
      if (!r.is_array() || r.size() != 3) fail(name, "malformed ranges entry (not [record, offset, length])");
      const char* bad = "malformed ranges entry (not [record, offset, length])";
      out.push_back({r.at(0).get<std::string>(), byte_count(r.at(1), name, bad), byte_count(r.at(2), name, bad)});
    }
  } catch (const nlohmann::json::exception&) {
    fail(name, "malformed ranges entry (not [record, offset, length])");
  }
  return out;
}

nlohmann::json cut_to_json(const CutList& c) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [o, l] : c.cut) list.push_back({o, l});
  return {{"file_size", c.file_size}, {"cut", list}};
}

CutList cut_from_json(const nlohmann::json& j, const std::string& name) {
  CutList c;
  try {
    if (!j.is_object()) fail(name, "malformed cut list: not an object");
    c.file_size = byte_count(j.at("file_size"), name, "malformed cut list: file_size is not a byte count");
    for (const auto& r : j.at("cut")) {
      const char* bad = "malformed cut list entry (not [offset, length])";
      if (!r.is_array() || r.size() != 2) fail(name, bad);
      c.cut.emplace_back(byte_count(r.at(0), name, bad), byte_count(r.at(1), name, bad));
    }
  } catch (const nlohmann::json::exception&) {
    fail(name, "malformed cut list (not {\"file_size\": n, \"cut\": [[offset, length], ...]})");
  }
  return c;
}

}  // namespace ucpkit::pec
