// Atomic tensor access and TP-slice range copies.
#include "reshard/universal_reader.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/confine.h"
#include "core/crc32.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "formats/universal/state_file.h"
#include "io/shape.h"
#include "io/torch/torch_file.h"

namespace fs = std::filesystem;

namespace ucpkit::reshard {

UniversalReader::UniversalReader(const ModelInfo& model, std::string dir, bool verify)
    : model_(model), dir_(std::move(dir)), verify_(verify) {
  entries_.resize(model.params.size() * model.states.size());
  for (auto& e : entries_) e = std::make_unique<Entry>();
  rlimit rl{};
  max_kept_fds_ = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                      ? std::max<int64_t>(1, static_cast<int64_t>(rl.rlim_cur) / 4)
                      : 4096;
}

UniversalReader::ReadFd::ReadFd(const Entry& e) : fd_(e.fd) {
  if (fd_ >= 0) return;
  owned_ = open_input(e.path, "state file");
  fd_ = owned_.get();
}

UniversalReader::Entry::~Entry() {
  if (fd >= 0) ::close(fd);
}

void AtomicCache::add(int param, int state, int64_t start, int64_t count, const float* data) {
  if (count > 0) intervals_[{param, state}].push_back({start, count, data});
}

void AtomicCache::copy(int param, int state, int64_t start, int64_t count, float* dst) const {
  auto it = intervals_.find({param, state});
  if (it != intervals_.end()) {
    const auto& v = it->second;
    auto j = std::upper_bound(v.begin(), v.end(), start, [](int64_t s, const Interval& iv) { return s < iv.start; });
    if (j != v.begin()) --j;
    // The elements may span intervals that continue each other (pieces of one tensor read as
    // separate units).
    for (; count > 0 && j != v.end() && j->start <= start && start < j->start + j->count; ++j) {
      const int64_t n = std::min(count, j->start + j->count - start);
      std::memcpy(dst, j->data + (start - j->start), static_cast<size_t>(n) * 4);
      dst += n, start += n, count -= n;
    }
    if (count == 0) return;
  }
  throw Error("internal error: atomic elements [" + std::to_string(start) + ", +" + std::to_string(count) +
              ") of parameter " + std::to_string(param) + " were not exchanged");
}

int UniversalReader::state_index(const std::string& state) const {
  for (size_t si = 0; si < model_.states.size(); ++si)
    if (model_.states[si] == state) return static_cast<int>(si);
  throw Error("no optimizer state '" + state + "' in the universal checkpoint");
}

UniversalReader::Entry& UniversalReader::entry(int param, const std::string& state) {
  const size_t si = static_cast<size_t>(state_index(state));
  auto& e = *entries_[static_cast<size_t>(param) * model_.states.size() + si];
  std::call_once(e.once, [&] {
    const auto& p = model_.params[param];
    const std::string path = (fs::path(dir_) / p.state_files.at(state)).string();
    auto tf = load_torch_file(path);
    const Tensor t = formats::universal::read_state_file(tf.root, path).param;
    if (t.dtype() != DType::Float32) fail(path, "state tensor is " + std::string(dtype_name(t.dtype())) + ", not float32");
    if (t.numel() != p.stored_numel)
      fail(path, "state tensor has " + std::to_string(t.numel()) + " elements but the manifest's shape has " +
                     std::to_string(p.stored_numel));
    // The same element count is not enough: TP slices are cut by the shape (a transposed or
    // re-split shape in the manifest would cut the wrong elements).
    if (p.flat ? t.dim() != 1 : t.shape() != p.shape) {
      const auto want = p.flat ? std::vector<int64_t>{p.stored_numel} : p.shape;
      fail(path, "state tensor has shape " + nlohmann::json(t.shape()).dump() + " but manifest.json says " +
                     nlohmann::json(want).dump());
    }
    if (!t.is_contiguous() || !t.storage()->is_mapped()) fail(path, "state tensor is not a contiguous stored tensor");
    // The element bytes' position in the file (storages of a zip torch file are stored records).
    e.offset = static_cast<uint64_t>(t.contiguous_bytes().data() - tf.file->data());
    e.path = path;
    if (kept_fds_.fetch_add(1) < max_kept_fds_) e.fd = open_input(path, "state file").release();
    e.ready = true;
  });
  if (!e.ready) throw Error(model_.params[param].name + ": state " + state + " failed to open earlier");
  return e;
}

namespace {
void expect_crc(const std::string& path, uint32_t crc, uint32_t manifest) {
  if (crc == manifest) return;
  char msg[64];
  std::snprintf(msg, sizeof msg, "%08x, manifest says %08x", static_cast<unsigned>(crc), manifest);
  fail(path, std::string("checksum mismatch: crc32 ") + msg);
}
}  // namespace

void UniversalReader::check(int param, const std::string& state) {
  if (source_) {  // direct mode: the checksum of the tensor as the source gives it
    if (!verifies(param)) return;
    const int si = state_index(state);
    const int64_t n = model_.params[param].stored_numel;
    thread_local std::vector<float> buf(2u << 20);
    uint32_t crc = 0;
    for (int64_t done = 0; done < n;) {
      const int64_t k = std::min<int64_t>(static_cast<int64_t>(buf.size()), n - done);
      source_->read(param, si, done, k, buf.data());
      crc = crc32_update(crc, {reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(k) * 4});
      done += k;
    }
    bytes_verified_ += static_cast<uint64_t>(n) * 4;
    source_->whole_crc(param, si, crc);
    return;
  }
  Entry& e = entry(param, state);
  if (!verifies(param)) return;
  const auto& p = model_.params[param];
  const uint64_t nbytes = static_cast<uint64_t>(p.stored_numel) * 4;
  thread_local std::vector<uint8_t> buf(8u << 20);
  uint32_t crc = 0;
  const ReadFd fd(e);
  for (uint64_t done = 0; done < nbytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), nbytes - done));
    pread_exact(fd.get(), buf.data(), n, e.offset + done, e.path);
    crc = crc32_update(crc, {buf.data(), n});
    done += n;
  }
  bytes_verified_ += nbytes;
  expect_crc(e.path, crc, p.crc32.at(state));
}

uint32_t UniversalReader::read_part(int param, const std::string& state, int64_t a, int64_t n, float* dst) {
  if (source_) {
    source_->read(param, state_index(state), a, n, dst);
    bytes_read_ += static_cast<uint64_t>(n) * 4;
    return verifies(param) && source_->wants_crc()
               ? crc32_update(0, {reinterpret_cast<const uint8_t*>(dst), static_cast<size_t>(n) * 4})
               : 0;
  }
  Entry& e = entry(param, state);
  const bool verify = verifies(param);
  auto* out = reinterpret_cast<uint8_t*>(dst);
  const uint64_t nbytes = static_cast<uint64_t>(n) * 4;
  uint32_t crc = 0;
  const ReadFd fd(e);
  for (uint64_t done = 0; done < nbytes;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(8u << 20, nbytes - done));
    pread_exact(fd.get(), out + done, k, e.offset + static_cast<uint64_t>(a) * 4 + done, e.path);
    if (verify) crc = crc32_update(crc, {out + done, k});  // still in cache
    done += k;
  }
  bytes_read_ += nbytes;
  return crc;
}

void UniversalReader::verify_whole(int param, const std::string& state, uint32_t crc) {
  if (!verifies(param)) return;
  if (source_) {
    bytes_verified_ += static_cast<uint64_t>(model_.params[param].stored_numel) * 4;
    return source_->whole_crc(param, state_index(state), crc);
  }
  const Entry& e = entry(param, state);
  const auto& p = model_.params[param];
  bytes_verified_ += static_cast<uint64_t>(p.stored_numel) * 4;
  expect_crc(e.path, crc, p.crc32.at(state));
}

void UniversalReader::read_range(int param, const std::string& state, const TpSlice& s, int64_t a, int64_t b,
                                 float* dst) {
  if (cache_ || source_) {  // elements from memory (the exchange's cache) or from the native source
    const int si = state_index(state);
    for_each_run(model_.params[param].shape, s, a, b, [&](int64_t src, int64_t n, int64_t at) {
      if (src < 0)
        std::memset(dst + at, 0, static_cast<size_t>(n) * 4);
      else if (cache_)
        cache_->copy(param, si, src, n, dst + at);
      else
        source_->read(param, si, src, n, dst + at);
    });
    if (!cache_) bytes_read_ += static_cast<uint64_t>(b - a) * 4;
    return;
  }
  Entry& e = entry(param, state);
  const ReadFd fd(e);
  for_each_run(model_.params[param].shape, s, a, b, [&](int64_t src, int64_t n, int64_t at) {
    if (src < 0)
      std::memset(dst + at, 0, static_cast<size_t>(n) * 4);
    else
      pread_exact(fd.get(), dst + at, static_cast<size_t>(n) * 4, e.offset + static_cast<uint64_t>(src) * 4, e.path);
  });
  bytes_read_ += static_cast<uint64_t>(b - a) * 4;
}

pickle::ValuePtr UniversalReader::step(int param) {
  const auto& p = model_.params[param];
  if (!p.step) return nullptr;
  if (source_) return source_->step(param);
  const auto path = (fs::path(dir_) / fs::path(p.state_files.at("fp32")).parent_path() / "step.pt").string();
  if (!fs::exists(path)) throw Error(path + ": missing (the universal checkpoint is incomplete)");
  return load_torch(path);
}

void for_each_run(const std::vector<int64_t>& ushape, const TpSlice& s, int64_t a, int64_t b,
                  const std::function<void(int64_t, int64_t, int64_t)>& emit) {
  if (b <= a) return;
  // Runs that continue each other in the source (rows of a slice that spans the whole dimension,
  // consecutive zero rows) are merged: one pread instead of one per row.
  int64_t p_src = 0, p_n = 0, p_at = 0;
  auto run = [&](int64_t src, int64_t n, int64_t at) {
    if (p_n > 0 && ((src < 0 && p_src < 0) || (src >= 0 && p_src >= 0 && src == p_src + p_n))) {
      p_n += n;
      return;
    }
    if (p_n > 0) emit(p_src, p_n, p_at);
    p_src = src, p_n = n, p_at = at;
  };
  if (s.shape.empty()) {
    emit(0, 1, 0);
    return;
  }
  const int d = s.dim;
  if (s.padded_rows >= 0 && d != 0) throw Error("vocabulary padding along a non-split dimension is not supported");
  int64_t inner = 1;
  for (size_t k = d + 1; k < s.shape.size(); ++k) inner *= s.shape[k];
  const int64_t D = s.shape[d], Ud = ushape[d];
  const int64_t block = D * inner;
  std::vector<int64_t> cum(s.pieces.size() + 1, 0);
  for (size_t j = 0; j < s.pieces.size(); ++j) cum[j + 1] = cum[j] + s.pieces[j].second;
  int64_t i = a;
  size_t j = 0;
  while (i < b) {
    const int64_t o = i / block, r = i % block, k = r / inner, x = r % inner;
    while (!(k >= cum[j] && k < cum[j + 1])) j = (k < cum[j]) ? 0 : j + 1;
    const int64_t sk = s.pieces[j].first + (k - cum[j]);
    const int64_t piece_end_sk = s.pieces[j].first + s.pieces[j].second;
    int64_t n;
    if (sk < Ud) {
      // Consecutive rows of one piece are consecutive in the source as well.
      n = std::min((std::min(piece_end_sk, Ud) - sk) * inner - x, b - i);
      run((o * Ud + sk) * inner + x, n, i - a);
    } else {
      n = std::min((piece_end_sk - sk) * inner - x, b - i);
      run(-1, n, i - a);
    }
    i += n;
  }
  emit(p_src, p_n, p_at);
}

void copy_flat_range(const float* src, const std::vector<int64_t>& ushape, const TpSlice& s, int64_t a, int64_t b,
                     float* dst) {
  for_each_run(ushape, s, a, b, [&](int64_t from, int64_t n, int64_t at) {
    if (from < 0)
      std::memset(dst + at, 0, static_cast<size_t>(n) * sizeof(float));
    else
      std::memcpy(dst + at, src + from, static_cast<size_t>(n) * sizeof(float));
  });
}

namespace {
// f32_to_bf16 (io/dtype.h) over n elements, written branch-free so that it vectorizes: the AVX2 clone
// takes about 1.5 instructions an element against 9 for the scalar call with its NaN branch (a quarter
// of ucp-load's direct mode). Same bits, NaN included (checked against f32_to_bf16 in its test).
__attribute__((target_clones("avx2", "default"))) void f32_to_bf16_n(const float* src, size_t n, uint16_t* out) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t quiet_nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    out[i] = static_cast<uint16_t>(static_cast<int32_t>(u & 0x7fffffffu) > 0x7f800000 ? quiet_nan : rounded);
  }
}
}  // namespace

void convert_from_fp32(const float* src, size_t n, DType target, uint8_t* dst) {
  switch (target) {
    case DType::Float32: std::memcpy(dst, src, n * 4); return;
    case DType::BFloat16: f32_to_bf16_n(src, n, reinterpret_cast<uint16_t*>(dst)); return;
    default: {
      std::vector<uint8_t> bytes(n * 4);
      std::memcpy(bytes.data(), src, n * 4);
      Tensor t = Tensor::from_bytes(DType::Float32, {static_cast<int64_t>(n)}, std::move(bytes)).to(target);
      std::memcpy(dst, t.contiguous_bytes().data(), t.nbytes());
    }
  }
}

// read_whole_tensor (universal_reader.h).
Tensor read_whole_tensor(const ModelInfo& model, UniversalReader& reader, int i, const std::string& state, DType dtype) {
  const auto& p = model.params[i];
  const TpSlice whole{0, {{0, p.shape.empty() ? 1 : p.shape[0]}}, p.shape, -1};
  const int64_t n = numel_of(p.shape);
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * es);
  if (dtype == DType::Float32) {
    if (n > 0) reader.read_range(i, state, whole, 0, n, reinterpret_cast<float*>(bytes.data()));
  } else {
    constexpr int64_t kWindow = 1 << 20;
    std::vector<float> f32(static_cast<size_t>(std::min(n, kWindow)));
    for (int64_t a = 0; a < n; a += kWindow) {
      const int64_t b = std::min(n, a + kWindow);
      reader.read_range(i, state, whole, a, b, f32.data());
      convert_from_fp32(f32.data(), static_cast<size_t>(b - a), dtype, bytes.data() + static_cast<size_t>(a) * es);
    }
  }
  return Tensor::from_bytes(dtype, p.shape, std::move(bytes));
}

Tensor read_buffer(const std::string& dir, const formats::universal::UniversalBuffer& b, bool verify) {
  const std::string manifest = (fs::path(dir) / formats::universal::kUniversalManifestName).string();
  const std::string path = confined_path(dir, b.tensor.file, manifest, "buffer " + b.name + " file").string();
  Tensor t = formats::universal::read_state_file(load_torch(path), path).param;
  if (t.shape() != b.shape)
    fail(path, "buffer has shape " + nlohmann::json(t.shape()).dump() + " but manifest.json says " + nlohmann::json(b.shape).dump());
  if (dtype_name(t.dtype()) != b.dtype)
    fail(path, "buffer is " + std::string(dtype_name(t.dtype())) + " but manifest.json says " + b.dtype);
  t = t.contiguous(true);
  if (verify && b.tensor.crc32) {
    const auto bytes = t.contiguous_bytes();
    expect_crc(path, crc32_update(0, {bytes.data(), bytes.size()}), *b.tensor.crc32);
  }
  return t;
}

}  // namespace ucpkit::reshard
