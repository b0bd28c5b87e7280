// Reading ZeRO optimizer shards.
#include "to_universal/shard_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/mapped_file.h"

#include "core/error.h"
#include "core/file_io.h"
#include "core/json_input.h"
#include "formats/deepspeed/moe.h"
#include "to_universal/value_json.h"

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

ShardView::ShardView(ValuePtr root, std::string path) : root_(std::move(root)), path_(std::move(path)) {
  if (!root_ || root_->kind != Kind::Dict) fail(path_, "not an optimizer-states dict");
  osd_ = root_->get("optimizer_state_dict");
  if (!osd_ || osd_->kind != Kind::Dict) fail(path_, "no optimizer_state_dict (not a ZeRO optimizer shard)");
  if (auto z = osd_->get("zero_stage"); z && !z->is_none() && z->as_int() == 3) {
    zero3_ = true;
    for (const char* k : {"fp32_flat_groups", "optimizer_state_dict"})
      if (!osd_->get(k)) fail(path_, std::string("ZeRO-3 optimizer_state_dict has no ") + k);
    return;
  }
  for (const char* k : {"param_slice_mappings", "single_partition_of_fp32_groups", "base_optimizer_state"})
    if (!osd_->get(k)) fail(path_, std::string("optimizer_state_dict has no ") + k);
}

int ShardView::groups() const {
  return static_cast<int>(osd_->at(zero3_ ? "fp32_flat_groups" : "param_slice_mappings")->items.size());
}

GroupInfo ShardView::group_info(int g) const {
  GroupInfo gi;
  if (zero3_) {
    if (auto pc = osd_->get("partition_count"); pc && pc->kind == Kind::Int) gi.partition_count = static_cast<int>(pc->i);
    return gi;
  }
  if (auto pc = osd_->get("partition_count")) {
    if (pc->is_sequence() && g < (int)pc->items.size()) gi.partition_count = static_cast<int>(pc->items[g]->as_int());
    else if (pc->kind == Kind::Int) gi.partition_count = static_cast<int>(pc->i);
  }
  auto base = osd_->at("base_optimizer_state");
  ValuePtr groups = base->kind == Kind::Dict ? base->get("param_groups") : nullptr;
  if (groups && groups->is_sequence() && g < (int)groups->items.size()) {
    const auto& pg = groups->items[g];
    if (auto m = pg->get("moe"); m && m->kind == Kind::Bool && m->b) {
      gi.moe = true;
      if (auto n = pg->get("name"); n && n->kind == Kind::Str)
        if (auto ep = formats::deepspeed::ep_size_from_group_name(n->s)) gi.ep_size = *ep;
    }
  }
  return gi;
}

std::vector<std::tuple<std::string, int64_t, int64_t>> ShardView::fragments(int g) const {
  std::vector<std::tuple<std::string, int64_t, int64_t>> out;
  const auto& m = osd_->at("param_slice_mappings")->items.at(g);
  if (!m || m->kind != Kind::Dict) fail(path_, "param_slice_mappings[" + std::to_string(g) + "] is not a dict");
  for (const auto& [k, v] : m->entries) {
    if (k->kind != Kind::Str) fail(path_, "param_slice_mappings[" + std::to_string(g) + "] has a key that is not a str");
    try {
      auto [numel, start] = v->as_fragment_address();
      out.emplace_back(k->s, start, numel);
    } catch (const Error& e) {
      fail(path_, "param_slice_mappings[" + std::to_string(g) + "] of " + escaped_brief(k->s, 80) + ": " + e.what());
    }
  }
  return out;
}

ValuePtr ShardView::group_state(int g) const {
  if (zero3_) return get_int_key(osd_->at("optimizer_state_dict")->get("state"), g);
  auto base = osd_->at("base_optimizer_state");
  if (base->is_sequence()) return g < (int)base->items.size() ? base->items[g] : nullptr;  // elastic
  return get_int_key(base->get("state"), g);
}

std::vector<std::string> ShardView::states(int g) const {
  std::vector<std::string> out;
  if (auto st = group_state(g); st && st->kind == Kind::Dict)
    for (const auto& [k, v] : st->entries)
      if (k->kind == Kind::Str && k->s != "step" && v && v->kind == Kind::Tensor && v->tensor->dim() == 1)
        out.push_back(k->s);
  std::sort(out.begin(), out.end());
  out.insert(out.begin(), "fp32");
  return out;
}

bool ShardView::has_step(int g) const {
  auto st = group_state(g);
  return st && st->kind == Kind::Dict && st->get("step");
}

ValuePtr ShardView::step(int g) const { return group_state(g)->at("step"); }

Tensor ShardView::state_tensor(int g, const std::string& state) const {
  ValuePtr v;
  if (state == "fp32") {
    const auto& groups = osd_->at(zero3_ ? "fp32_flat_groups" : "single_partition_of_fp32_groups");
    if (!groups->is_sequence() || g >= (int)groups->items.size())
      fail(path_, "single_partition_of_fp32_groups has no group " + std::to_string(g));
    v = groups->items[g];
  } else {
    auto st = group_state(g);
    if (!st || st->kind != Kind::Dict || !(v = st->get(state)))
      fail(path_, "optimizer state of group " + std::to_string(g) + " has no " + state);
  }
  if (!v || v->kind != Kind::Tensor) fail(path_, state + " of group " + std::to_string(g) + " is not a tensor");
  return v->as_tensor();
}

SourceCache::SourceCache(std::vector<std::string> files) : files_(std::move(files)) {
  loaded_.resize(files_.size());
  fds_.assign(files_.size(), -1);
  for (size_t i = 0; i < files_.size(); ++i) {
    once_.push_back(std::make_unique<std::once_flag>());
    fd_once_.push_back(std::make_unique<std::once_flag>());
  }
}

SourceCache::~SourceCache() {
  for (int fd : fds_)
    if (fd >= 0) ::close(fd);
}

bool SourceCache::read_into(int file, const Tensor& t, uint8_t* dst) {
  const auto& st = t.storage();
  if (!st || !st->is_mapped() || !t.is_contiguous()) return false;
  auto tf = get(file);
  if (!tf->file) return false;
  const uint8_t* base = tf->file->data();
  const uint8_t* p = st->bytes().data() + static_cast<size_t>(t.storage_offset()) * dtype_size(t.dtype());
  if (p < base || p + t.nbytes() > base + tf->file->size()) return false;
  std::call_once(*fd_once_[file], [&] { fds_[file] = ::open(files_[file].c_str(), O_RDONLY | O_CLOEXEC); });
  const int fd = fds_[file];
  if (fd < 0) return false;
  pread_exact(fd, dst, t.nbytes(), static_cast<uint64_t>(p - base), files_[file]);
  return true;
}

std::shared_ptr<const TorchFile> SourceCache::get(int file) {
  std::call_once(*once_.at(file), [&] { loaded_[file] = std::make_shared<TorchFile>(load_torch_file(files_[file])); });
  return loaded_[file];
}

void release_pages(const Tensor& t) {
  const auto& st = t.storage();
  if (!st || !st->is_mapped() || t.numel() == 0) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  auto bytes = st->bytes();
  // The bytes the view can touch: its first element to its last (a stride-0 / expanded view touches
  // one element, whatever its numel), never past its storage (which lies inside the file mapping).
  int64_t last = 0;
  for (size_t d = 0; d < t.shape().size(); ++d) {
    if (t.strides()[d] < 0) return;
    last += (t.shape()[d] - 1) * t.strides()[d];
  }
  const size_t es = dtype_size(t.dtype());
  const size_t first = static_cast<size_t>(t.storage_offset()) * es;
  const size_t end = std::min(bytes.size(), first + (static_cast<size_t>(last) + 1) * es);
  if (first >= end) return;
  const uintptr_t base = reinterpret_cast<uintptr_t>(bytes.data());
  uintptr_t lo = (base + first + page - 1) & ~(page - 1);
  uintptr_t hi = (base + end) & ~(page - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
}

Tensor fragment_tensor(SourceCache& cache, const SourceFragment& f, const std::string& state) {
  auto tf = cache.get(f.file);
  Tensor flat;
  if (f.group >= 0) {
    flat = ShardView(tf->root, cache.path(f.file)).state_tensor(f.group, state);
  } else {
    auto v = tf->root ? tf->root->get(state) : nullptr;
    if (!v || v->kind != Kind::Tensor) fail(cache.path(f.file), "fragment file has no tensor " + state);
    flat = v->as_tensor();
  }
  if (flat.dim() != 1) fail(cache.path(f.file), state + " partition is not 1-D");
  if (f.offset < 0 || f.offset + f.numel > flat.numel())
    fail(cache.path(f.file), state + " partition has " + std::to_string(flat.numel()) + " elements, fragment needs [" +
                                 std::to_string(f.offset) + ", " + std::to_string(f.offset + f.numel) + ")");
  return flat.narrow(0, f.offset, f.numel);
}

Tensor read_slice(SourceCache& cache, const std::vector<SourceFragment>& fragments, const std::string& state,
                  const std::vector<int64_t>& shape, uint64_t* bytes_read) {
  std::vector<Tensor> parts;
  parts.reserve(fragments.size());
  for (const auto& f : fragments) parts.push_back(fragment_tensor(cache, f, state));
  if (parts.empty()) throw Error("no fragments for " + state);
  const DType dt = parts[0].dtype();
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].dtype() != dt)
      fail(cache.path(fragments[i].file), "fragment dtype " + std::string(dtype_name(parts[i].dtype())) +
                                              " differs from " + std::string(dtype_name(dt)));
    total += parts[i].numel();
  }
  std::vector<uint8_t> buf(static_cast<size_t>(total) * dtype_size(dt));
  size_t off = 0;
  for (const auto& p : parts) {
    p.copy_to(buf.data() + off);
    off += p.nbytes();
    release_pages(p);
  }
  if (bytes_read) *bytes_read += buf.size();
  return Tensor::from_bytes(dt, shape, std::move(buf));
}

ValuePtr read_step(SourceCache& cache, int file, int group) {
  auto tf = cache.get(file);
  if (group >= 0) return ShardView(tf->root, cache.path(file)).step(group);
  auto v = tf->root ? tf->root->get("step") : nullptr;
  if (!v) fail(cache.path(file), "fragment file has no step");
  return v;
}

}  // namespace ucpkit::to_universal
