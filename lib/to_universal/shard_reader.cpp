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

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

ShardView::ShardView(ValuePtr root, std::string path)
    : shard_(formats::deepspeed::read_optimizer_shard(root, path)), path_(std::move(path)) {}

const formats::deepspeed::OptimizerShard::Group& ShardView::group(int g) const {
  if (g < 0 || g >= groups()) fail(path_, "single_partition_of_fp32_groups has no group " + std::to_string(g));
  return shard_.groups[static_cast<size_t>(g)];
}

GroupInfo ShardView::group_info(int g) const {
  GroupInfo gi;
  if (shard_.zero3()) {
    gi.partition_count = shard_.partition_count;
    return gi;
  }
  const auto& grp = group(g);
  gi.partition_count = grp.partition_count;
  gi.moe = grp.moe;
  if (grp.moe) gi.ep_size = grp.ep_size;
  return gi;
}

std::vector<std::tuple<std::string, int64_t, int64_t>> ShardView::fragments(int g) const {
  std::vector<std::tuple<std::string, int64_t, int64_t>> out;
  for (const auto& f : group(g).fragments) out.emplace_back(f.param, f.start, f.numel);
  return out;
}

std::vector<std::string> ShardView::states(int g) const {
  std::vector<std::string> out;
  for (const auto& [name, t] : group(g).moments)
    if (t.dim() == 1) out.push_back(name);
  std::sort(out.begin(), out.end());
  out.insert(out.begin(), "fp32");
  return out;
}

ValuePtr ShardView::step(int g) const {
  const auto& s = group(g).step;
  if (!s) fail(path_, "optimizer state of group " + std::to_string(g) + " has no step");
  return s;
}

Tensor ShardView::state_tensor(int g, const std::string& state) const {
  const auto& grp = group(g);
  if (state == "fp32") return grp.fp32;
  for (const auto& [name, t] : grp.moments)
    if (name == state) return t;
  fail(path_, "optimizer state of group " + std::to_string(g) + " has no " + state);
}

SourceCache::SourceCache(std::vector<std::string> files, const TorchLoadOptions& open)
    : files_(std::move(files)), open_(open) {
  loaded_.resize(files_.size());
  shards_.resize(files_.size());
  fds_.assign(files_.size(), -1);
  for (size_t i = 0; i < files_.size(); ++i) {
    once_.push_back(std::make_unique<std::once_flag>());
    shard_once_.push_back(std::make_unique<std::once_flag>());
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
  std::call_once(*fd_once_[file], [&] { fds_[file] = ::open(files_[file].c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC); });
  const int fd = fds_[file];
  if (fd < 0) return false;
  pread_exact(fd, dst, t.nbytes(), static_cast<uint64_t>(p - base), files_[file]);
  return true;
}

std::shared_ptr<const TorchFile> SourceCache::get(int file) {
  std::call_once(*once_.at(file), [&] { loaded_[file] = std::make_shared<TorchFile>(load_torch_file(files_[file], open_)); });
  return loaded_[file];
}

const ShardView& SourceCache::shard(int file) {
  std::call_once(*shard_once_.at(file), [&] { shards_[file] = std::make_unique<ShardView>(get(file)->root, files_[file]); });
  return *shards_[file];
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
    flat = cache.shard(f.file).state_tensor(f.group, state);
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
  if (group >= 0) return cache.shard(file).step(group);
  auto tf = cache.get(file);
  auto v = tf->root ? tf->root->get("step") : nullptr;
  if (!v) fail(cache.path(file), "fragment file has no step");
  return v;
}

}  // namespace ucpkit::to_universal
