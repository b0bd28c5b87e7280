// Module weights against the fp32 master partitions.
#include "to_universal/master_image.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/pipeline.h"
#include "io/shape.h"
#include "io/dtype.h"
#include "io/torch/verify.h"
#include "to_universal/image_difference.h"
#include "to_universal/shard_reader.h"

namespace ucpkit::to_universal {

namespace fs = std::filesystem;

namespace {

std::string hex(uint32_t v, int digits) {
  static const char* d = "0123456789abcdef";
  std::string s = "0x";
  for (int i = digits - 1; i >= 0; --i) s += d[(v >> (4 * i)) & 15];
  return s;
}

// The shard holding element `e` of TP slice t's fp32 master (fragments in partition order).
const std::string& shard_of(const ParamPlan& p, size_t t, int64_t e, const std::vector<std::string>& files) {
  for (const auto& f : p.fragments[t]) {
    if (e < f.numel) return files[f.file];
    e -= f.numel;
  }
  return files[p.fragments[t].back().file];
}

}  // namespace

MasterImage::MasterImage(const ExtractPlan& plan, bool verify, const TorchLoadOptions& open) : open_(open) {
  const auto& src = plan.source;
  // ZeRO-3 keeps no weights in its model files.
  if (src.zero_stage == 3) return;
  // --no-verify: the way out for a checkpoint whose module weights were edited on purpose after the save.
  if (!verify) return;
  const int tp = src.tp_or_1();
  if (src.pipeline.value_or(false)) {
    // Layer files name their tensors locally: layer_NN's "<local>" is parameter "NN.<local>", and a tied
    // module's "<local>" is "tied_modules.<key>.<local>" in every layer file that holds it.
    std::map<std::string, std::string> tied;
    std::map<int, std::map<std::string, std::string>> numbered;
    for (const auto& p : plan.params) {
      if (p.expert >= 0 || p.autoep_experts > 0) continue;
      const auto [idx, local] = formats::deepspeed::split_pipeline_name(p.name);
      if (idx >= 0) numbered[idx][local] = p.name;
      else if (idx == -1) tied[local] = p.name;
    }
    // Beside the model files (one step), else in the source folder the plan records (a work folder
    // copies the model files, not the layer files).
    std::vector<std::string> dirs;
    if (!plan.model_files.empty()) dirs.push_back(fs::path(plan.model_files[0]).parent_path().string());
    if (src.dir) dirs.push_back(*src.dir);
    std::map<int, std::vector<std::string>> layers;  // layer -> [tp]
    for (const auto& dir : dirs) {
      try {
        layers = formats::deepspeed::discover(dir).layer_files;
      } catch (const Error&) {  // a work folder's model_states/: no shards, so no layout there
      }
      if (!layers.empty()) break;
    }
    for (const auto& [idx, row] : layers) {
      if (static_cast<int>(row.size()) != tp) continue;
      std::map<std::string, std::string> names = tied;
      if (auto it = numbered.find(idx); it != numbered.end())
        for (const auto& [local, name] : it->second) names[local] = name;
      for (size_t t = 0; t < row.size(); ++t)
        if (!row[t].empty()) index_file(row[t], names, t, /*only_compared=*/true);
    }
    return;
  }
  if (src.pp_or_1() != 1) return;
  std::map<int, std::string> by_rank;
  for (const auto& f : plan.model_files)
    if (auto n = formats::deepspeed::parse_file_name(fs::path(f).filename().string());
        n && n->kind == formats::deepspeed::FileKind::ModelStates)
      by_rank[n->mp] = f;
  if (static_cast<int>(by_rank.size()) != tp) return;
  std::map<std::string, std::string> same;  // module names are the parameters' names
  for (const auto& p : plan.params) same[p.name] = p.name;
  for (const auto& [rank, path] : by_rank) index_file(path, same, static_cast<size_t>(rank));
}

void MasterImage::index_file(const std::string& path, const std::map<std::string, std::string>& names, size_t tp_rank,
                             bool only_compared) {
  // A layer file is read only to be compared (the conversion reads the optimizer shards): no CRC pass at
  // open, since equal weights prove their bytes intact; a difference checks the CRCs (compare()) so that a
  // damaged file is reported as damaged.
  TorchLoadOptions o = open_;
  if (only_compared) o.crc_at_open = false;
  files_.push_back(load_torch_file(path, o));
  for (const auto& [local, v] : formats::deepspeed::read_model_states(files_.back(), path).module) {
    if (!v || v->kind != pickle::Kind::Tensor) continue;
    const auto it = names.find(local);
    if (it == names.end()) continue;
    auto& sets = weights_[it->second];
    // A file of TP rank 0 starts a set (the tied module's second file a second one); rank t joins the
    // last set when that set has t copies.
    if (tp_rank == 0) sets.emplace_back();
    if (sets.empty() || sets.back().size() != tp_rank) continue;
    sets.back().push_back({path, v->as_tensor()});
  }
}

namespace {
// Elements [pos, pos + n) of a weight, flat.
Tensor run_of(const Tensor& w, int64_t pos, int64_t n) {
  return w.contiguous().reshape({w.numel()}).narrow(0, pos, n);  // a view of a contiguous weight
}
}  // namespace

void MasterImage::compare(const ParamPlan& p, size_t t, int64_t pos, const float* fp32, int64_t n, const Copy& c,
                          const Copy* checked, const std::vector<std::string>& files) const {
  const DType d = c.weight.dtype();
  if (d != DType::BFloat16 && d != DType::Float16 && d != DType::Float32) return;
  // In windows, each window's pages leaving the resident set once compared (release_pages): a whole
  // weight kept resident while compared added the largest weights of two threads to the peak RSS
  // (ucp-union, hidden 1024: 250 -> 330 MB).
  constexpr int64_t kWindow = int64_t{1} << 20;
  const Tensor all = run_of(c.weight, pos, n);
  const Tensor other = checked && checked->weight.dtype() == d ? run_of(checked->weight, pos, n) : Tensor();
  bool same_as_checked = other.numel() == n;
  for (int64_t at = 0; at < n; at += kWindow) {
    const int64_t m = std::min(kWindow, n - at);
    const Tensor w = all.narrow(0, at, m);
    // A tied module's second file: equal bytes to the copy just checked is the same image (a memcmp
    // instead of the rounding: the tied embedding is the largest weight of a model).
    if (same_as_checked) {
      const Tensor v = other.narrow(0, at, m);
      const auto a = w.contiguous_bytes(), b = v.contiguous_bytes();
      same_as_checked = a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
      release_pages(v);
      if (same_as_checked) {
        release_pages(w);
        continue;
      }
    }
    uint32_t stored = 0, image = 0;
    const int64_t e = first_image_difference(fp32 + at, m, w, &stored, &image);
    release_pages(w);
    if (e < 0) continue;
    // Damage, not another run, when the file's records fail their CRC-32 (throws naming the record).
    if (verify_files_crc()) (void)load_torch_file(c.path);
    const int digits = d == DType::Float32 ? 8 : 4;
    fail(c.path, "module weight " + p.name + " element " + std::to_string(pos + at + e) + " is " +
                     std::string(dtype_name(d)) + " " + hex(stored, digits) + " but the fp32 master in " +
                     shard_of(p, t, pos + at + e, files) + " rounds to " + hex(image, digits) +
                     ": this model file and that optimizer shard are of different runs (or one is damaged; "
                     "--no-verify skips this check)");
  }
}

void MasterImage::check(const ParamPlan& p, std::span<const uint8_t> fp32, const std::vector<size_t>& offsets,
                        const std::vector<std::string>& files) const {
  if (p.expert >= 0 || p.autoep_experts > 0) return;  // expert weights: other files, local names
  auto it = weights_.find(p.name);
  if (it == weights_.end() || offsets.size() != p.tp_shapes.size()) return;
  std::vector<const Copy*> checked(offsets.size());  // [t] the copy of slice t compared first
  for (const TpCopies& copies : it->second) {
    if (copies.size() != p.tp_shapes.size()) continue;
    for (size_t t = 0; t < offsets.size(); ++t) {
      const size_t end = t + 1 < offsets.size() ? offsets[t + 1] : fp32.size();
      const int64_t n = static_cast<int64_t>((end - offsets[t]) / 4);
      const Copy& c = copies[t];
      if (c.weight.numel() != n) continue;
      compare(p, t, 0, reinterpret_cast<const float*>(fp32.data() + offsets[t]), n, c, checked[t], files);
      release_pages(c.weight);  // each weight is read once: keep a big model's module out of the RSS
      if (!checked[t]) checked[t] = &c;
    }
  }
}

void MasterImage::check_run(const ParamPlan& p, size_t t, int64_t pos, const float* fp32, int64_t n,
                            const std::vector<std::string>& files) const {
  if (p.expert >= 0 || p.autoep_experts > 0 || n <= 0) return;
  auto it = weights_.find(p.name);
  if (it == weights_.end()) return;
  const Copy* checked = nullptr;
  for (const TpCopies& copies : it->second) {
    if (copies.size() != p.tp_shapes.size() || t >= copies.size()) continue;
    const Copy& c = copies[t];
    if (c.weight.numel() != numel_of(p.tp_shapes[t]) || pos < 0 || pos + n > c.weight.numel()) continue;
    compare(p, t, pos, fp32, n, c, checked, files);
    if (!checked) checked = &c;
  }
}

}  // namespace ucpkit::to_universal
