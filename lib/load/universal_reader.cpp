// Atomic tensor access and TP-slice range copies.
#include "load/universal_reader.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "ucp/save.h"

namespace fs = std::filesystem;

namespace ucpkit::load {

using pickle::Kind;

UniversalReader::UniversalReader(const ModelInfo& model, std::string dir, bool verify)
    : model_(model), dir_(std::move(dir)), verify_(verify) {
  entries_.resize(model.params.size() * model.states.size());
  for (auto& e : entries_) e = std::make_unique<Entry>();
}

const Tensor& UniversalReader::tensor(int param, const std::string& state) {
  size_t si = 0;
  while (si < model_.states.size() && model_.states[si] != state) ++si;
  if (si == model_.states.size()) throw Error("no optimizer state '" + state + "' in the universal checkpoint");
  auto& e = *entries_[static_cast<size_t>(param) * model_.states.size() + si];
  std::call_once(e.once, [&] {
    const auto& p = model_.params[param];
    const std::string path = (fs::path(dir_) / p.state_files.at(state)).string();
    auto tf = load_torch_file(path);
    Tensor t;
    if (tf.root && tf.root->kind == Kind::Dict) {
      auto v = tf.root->get("param");
      if (!v || v->kind != Kind::Tensor) fail(path, "no 'param' tensor");
      t = v->as_tensor();
    } else if (tf.root && tf.root->kind == Kind::Tensor) {
      t = tf.root->as_tensor();  // ZeRO-3 style bare tensor
    } else {
      fail(path, "not a universal state file");
    }
    if (t.dtype() != DType::Float32) fail(path, "state tensor is " + std::string(dtype_name(t.dtype())) + ", not float32");
    if (t.numel() != TpSlice{0, {}, p.shape, -1}.numel())
      fail(path, "state tensor has " + std::to_string(t.numel()) + " elements but the manifest says shape of " +
                     std::to_string(TpSlice{0, {}, p.shape, -1}.numel()));
    t = t.contiguous();
    if (verify_) {
      const uint32_t crc = ucp::tensor_crc32(t);
      if (crc != p.crc32.at(state)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%08x, manifest says %08x", crc, p.crc32.at(state));
        fail(path, std::string("checksum mismatch: crc32 ") + buf);
      }
    }
    bytes_read_ += t.nbytes();
    e.tensor = std::move(t);
  });
  return e.tensor;
}

pickle::ValuePtr UniversalReader::step(int param) {
  const auto& p = model_.params[param];
  if (!p.step) return nullptr;
  const auto path = (fs::path(dir_) / fs::path(p.state_files.at("fp32")).parent_path() / "step.pt").string();
  if (!fs::exists(path)) throw Error(path + ": missing (the universal checkpoint is incomplete)");
  return load_torch(path);
}

void copy_flat_range(const float* src, const std::vector<int64_t>& ushape, const TpSlice& s, int64_t a, int64_t b,
                     float* dst) {
  if (b <= a) return;
  if (s.shape.empty()) {
    dst[0] = src[0];
    return;
  }
  const int d = s.dim;
  if (s.padded_rows >= 0 && d != 0) throw Error("vocabulary padding along a non-split dimension is not supported");
  int64_t inner = 1;
  for (size_t k = d + 1; k < s.shape.size(); ++k) inner *= s.shape[k];
  const int64_t D = s.shape[d], Ud = ushape[d];
  const int64_t block = D * inner;
  // Cumulative offsets of the pieces along dim d.
  std::vector<int64_t> cum(s.pieces.size() + 1, 0);
  for (size_t j = 0; j < s.pieces.size(); ++j) cum[j + 1] = cum[j] + s.pieces[j].second;
  int64_t i = a;
  size_t j = 0;
  while (i < b) {
    const int64_t o = i / block, r = i % block, k = r / inner, x = r % inner;
    while (!(k >= cum[j] && k < cum[j + 1])) j = (k < cum[j]) ? 0 : j + 1;
    const int64_t sk = s.pieces[j].first + (k - cum[j]);
    const int64_t piece_end_sk = s.pieces[j].first + s.pieces[j].second;
    int64_t run;
    if (sk < Ud) {
      run = (std::min(piece_end_sk, Ud) - sk) * inner - x;
      run = std::min(run, b - i);
      std::memcpy(dst, src + (o * Ud + sk) * inner + x, static_cast<size_t>(run) * sizeof(float));
    } else {
      run = std::min((piece_end_sk - sk) * inner - x, b - i);
      std::memset(dst, 0, static_cast<size_t>(run) * sizeof(float));
    }
    dst += run;
    i += run;
  }
}

void convert_from_fp32(const float* src, size_t n, DType target, uint8_t* dst) {
  switch (target) {
    case DType::Float32: std::memcpy(dst, src, n * 4); return;
    case DType::BFloat16: {
      auto* out = reinterpret_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, &src[i], 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) {
          out[i] = static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN, sign kept
        } else {
          out[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
      }
      return;
    }
    default: {
      std::vector<uint8_t> bytes(n * 4);
      std::memcpy(bytes.data(), src, n * 4);
      Tensor t = Tensor::from_bytes(DType::Float32, {static_cast<int64_t>(n)}, std::move(bytes)).to(target);
      std::memcpy(dst, t.contiguous_bytes().data(), t.nbytes());
    }
  }
}

}  // namespace ucpkit::load
