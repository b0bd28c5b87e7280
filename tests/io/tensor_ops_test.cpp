// Tensor operations (to, narrow, cat, contiguous, equal) against torch's results. Inputs and expected
// outputs are built from the JSON truth of ops.pt alone (owned storages), not through the reader.
#include "truth_check.h"

namespace iotest {
namespace {

const json& ops_truth() {
  static json t = truth_of("ops");
  return t;
}
const json& storages() { return ops_truth()["storages"]; }
const json& entry(const json& dict, const std::string& key) {
  for (const auto& e : dict["entries"])
    if (e[0]["v"] == key) return e[1];
  throw std::runtime_error("no key " + key);
}
Tensor make(const json& t) { return tensor_from_truth(t, storages()); }

std::string elem_hex(const std::string& hex, size_t i, size_t esize) { return hex.substr(2 * i * esize, 2 * esize); }

// NaN test on one element's bytes (NaN payloads are not compared: torch's vectorized fp32->bf16 path
// writes 0xffff, its scalar path 0x7fc0).
bool is_nan(const std::string& hex, DType dt) {
  auto b = from_hex(hex);
  uint64_t u = 0;
  for (size_t k = 0; k < b.size(); ++k) u |= static_cast<uint64_t>(b[k]) << (8 * k);
  switch (dt) {
    case DType::BFloat16: return (u & 0x7f80) == 0x7f80 && (u & 0x7f);
    case DType::Float16: return (u & 0x7c00) == 0x7c00 && (u & 0x3ff);
    case DType::Float32: return (u & 0x7f800000) == 0x7f800000 && (u & 0x7fffff);
    case DType::Float64: return (u & 0x7ff0000000000000ULL) == 0x7ff0000000000000ULL && (u & 0xfffffffffffffULL);
    default: return false;
  }
}

// Conversions between all floating dtypes, including ties, subnormals, overflow, NaN, inf, -0.0 and
// float64 values whose float32 rounding lands on a float16/bfloat16 tie.
TEST(TensorOperations, ToMatchesTorch) {
  const json& conv = entry(ops_truth()["value"], "conv");
  int checked = 0;
  for (const auto& e : conv["entries"]) {
    std::string src_name = e[0]["v"];
    Tensor src = make(entry(e[1], "src"));
    for (const auto& te : e[1]["entries"]) {
      std::string target = te[0]["v"];
      if (target == "src") continue;
      const json& want = te[1];
      DType dt = dtype_of(target);
      Tensor got;
      try {
        got = src.to(dt);
      } catch (const std::exception& ex) {
        ADD_FAILURE() << src_name << " -> " << target << " threw " << ex.what();
        continue;
      }
      ASSERT_EQ(got.dtype(), dt);
      ASSERT_EQ(got.shape(), want["shape"].get<std::vector<int64_t>>());
      std::string gh = tensor_hex(got), wh = want["hex"];
      size_t es = ucpkit::dtype_size(dt), src_es = ucpkit::dtype_size(src.dtype());
      std::string sh = tensor_hex(src);
      int bad = 0;
      std::ostringstream first;
      for (size_t i = 0; i < static_cast<size_t>(got.numel()); ++i) {
        std::string g = elem_hex(gh, i, es), w = elem_hex(wh, i, es);
        if (g != w && !(is_nan(g, dt) && is_nan(w, dt))) {
          if (bad < 5)
            first << "\n  element " << i << ": source bytes(le) " << elem_hex(sh, i, src_es) << " -> got "
                  << elem_hex(gh, i, es) << ", torch " << elem_hex(wh, i, es);
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0) << src_name << " -> " << target << ": " << bad << " of " << got.numel()
                        << " elements differ from torch" << first.str();
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

TEST(TensorOperations, NarrowIsAViewLikeTorch) {
  const json& cases = entry(ops_truth()["value"], "narrow");
  for (const auto& c : cases["items"]) {
    Tensor src = make(c["items"][0]);
    int64_t dim = c["items"][1]["i"], start = c["items"][2]["i"], len = c["items"][3]["i"];
    const json& want = c["items"][4];
    Tensor got = src.narrow(dim, start, len);
    std::string what = "narrow(" + std::to_string(dim) + ", " + std::to_string(start) + ", " + std::to_string(len) + ")";
    EXPECT_EQ(got.shape(), want["shape"].get<std::vector<int64_t>>()) << what;
    EXPECT_EQ(got.strides(), want["strides"].get<std::vector<int64_t>>()) << what;
    // an empty view's offset is unobservable (ucpkit keeps the source's, torch moves it to start)
    if (len > 0) EXPECT_EQ(got.storage_offset(), want["offset"].get<int64_t>()) << what;
    EXPECT_EQ(got.storage().get(), src.storage().get()) << what << " must not copy";
    EXPECT_EQ(tensor_hex(got), want["hex"].get<std::string>()) << what;
  }
  Tensor t = make(entry(ops_truth()["value"], "narrow")["items"][0]["items"][0]);
  EXPECT_THROW(t.narrow(0, 3, 5), ucpkit::Error);
  EXPECT_THROW(t.narrow(7, 0, 1), ucpkit::Error);
  EXPECT_THROW(t.narrow(0, -1, 1), ucpkit::Error);
}

TEST(TensorOperations, CatMatchesTorch) {
  const json& cases = entry(ops_truth()["value"], "cat");
  for (const auto& c : cases["items"]) {
    std::vector<Tensor> parts;
    for (const auto& p : c["items"][0]["items"]) parts.push_back(make(p));
    int64_t dim = c["items"][1]["i"];
    const json& want = c["items"][2];
    Tensor got = ucpkit::cat(parts, dim);
    EXPECT_EQ(std::string(ucpkit::dtype_name(got.dtype())), want["dtype"].get<std::string>());
    EXPECT_EQ(got.shape(), want["shape"].get<std::vector<int64_t>>()) << "cat dim " << dim;
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(tensor_hex(got), want["hex"].get<std::string>()) << "cat dim " << dim;
  }
  std::vector<Tensor> mismatched = {Tensor::zeros(DType::Float32, {2, 3}), Tensor::zeros(DType::Float32, {3, 3})};
  EXPECT_THROW(ucpkit::cat(mismatched, 1), ucpkit::Error);
  std::vector<Tensor> mixed = {Tensor::zeros(DType::Float32, {2}), Tensor::zeros(DType::BFloat16, {2})};
  EXPECT_THROW(ucpkit::cat(mixed, 0), ucpkit::Error);
}

TEST(TensorOperations, ContiguousMatchesTorch) {
  const json& cases = entry(ops_truth()["value"], "contiguous");
  for (const auto& c : cases["items"]) {
    Tensor src = make(c);
    EXPECT_FALSE(src.is_contiguous());
    EXPECT_THROW((void)src.contiguous_bytes(), ucpkit::Error);
    Tensor got = src.contiguous();
    EXPECT_TRUE(got.is_contiguous());
    EXPECT_EQ(got.strides(), Tensor::contiguous_strides(got.shape()));
    EXPECT_EQ(got.shape(), src.shape());
    auto b = got.contiguous_bytes();
    EXPECT_EQ(to_hex(b.data(), b.size()), c["hex"].get<std::string>());
  }
  // already contiguous: same storage unless a copy is forced
  Tensor a = make(entry(ops_truth()["value"], "narrow")["items"][0]["items"][0]);
  ASSERT_TRUE(a.is_contiguous());
  EXPECT_EQ(a.contiguous().storage().get(), a.storage().get());
  Tensor copy = a.contiguous(true);
  EXPECT_NE(copy.storage().get(), a.storage().get());
  EXPECT_TRUE(copy.equal(a));
}

TEST(TensorOperations, EqualIsBitwise) {
  const json& cases = entry(ops_truth()["value"], "equal");
  for (const auto& c : cases["items"]) {
    Tensor x = make(c["items"][0]), y = make(c["items"][1]);
    bool want = c["items"][2]["v"];
    EXPECT_EQ(x.equal(y), want) << x.dim() << "-d " << ucpkit::dtype_name(x.dtype()) << " vs " << y.dim() << "-d "
                                << ucpkit::dtype_name(y.dtype());
    EXPECT_EQ(y.equal(x), want);
  }
}

TEST(TensorOperations, ToVectorAndReshape) {
  const json& conv = entry(ops_truth()["value"], "conv");
  Tensor f = make(entry(entry(conv, "float32"), "src"));
  auto v = f.to_vector<float>();
  ASSERT_EQ(v.size(), static_cast<size_t>(f.numel()));
  EXPECT_EQ(to_hex(v.data(), v.size() * 4), tensor_hex(f));
  Tensor r = f.reshape({f.numel(), 1});
  EXPECT_EQ(r.shape(), (std::vector<int64_t>{f.numel(), 1}));
  EXPECT_EQ(tensor_hex(r), tensor_hex(f));
  // a non-contiguous source is copied (like torch.reshape): logical order is kept
  for (const auto& c : entry(ops_truth()["value"], "contiguous")["items"]) {
    Tensor src = make(c);
    Tensor flat = src.reshape({src.numel()});
    EXPECT_EQ(flat.shape(), (std::vector<int64_t>{src.numel()}));
    EXPECT_EQ(tensor_hex(flat), c["hex"].get<std::string>());
  }
  EXPECT_THROW(f.reshape({f.numel() + 1}), ucpkit::Error);
}

// The form real DCP saves of uneven shards carry: an empty chunk [2, 0] with strides [1, 1]. torch
// calls every zero-element tensor contiguous (is_contiguous
// of torch.empty_strided((2, 0), (1, 1)) is True); so do we, and such tensors compare by shape and dtype.
TEST(TensorOperations, EmptyTensorsAreContiguousWhateverTheirStrides) {
  Tensor odd(ucpkit::Storage::zeros(DType::Float32, 0), 0, {2, 0}, {1, 1});
  EXPECT_TRUE(odd.is_contiguous());
  EXPECT_TRUE(odd.contiguous_bytes().empty());
  EXPECT_TRUE(odd.equal(Tensor::zeros(DType::Float32, {2, 0})));
  EXPECT_FALSE(odd.equal(Tensor::zeros(DType::Float32, {0, 2})));
  EXPECT_FALSE(odd.equal(Tensor::zeros(DType::BFloat16, {2, 0})));
}

// A read buffer (ucp-union's slices): uninitialized bytes the caller fills, then truncated to the
// unpadded rows without a copy; torch.save writes the whole storage, so the truncated size is what is saved.
TEST(TensorOperations, UninitializedStorageIsFilledThenTruncated) {
  auto s = ucpkit::Storage::uninitialized(DType::Float32, 6);
  ASSERT_EQ(s->nbytes(), 24u);
  float* f = reinterpret_cast<float*>(s->mutable_bytes().data());
  for (int i = 0; i < 6; ++i) f[i] = static_cast<float>(i) + 0.5f;
  s->truncate(4);
  EXPECT_EQ(s->numel(), 4);
  EXPECT_EQ(s->bytes().size(), 16u);
  const Tensor t(s, 0, {2, 2}, {2, 1});
  EXPECT_TRUE(t.equal(Tensor::from_vector<float>(DType::Float32, {2, 2}, std::vector<float>{0.5f, 1.5f, 2.5f, 3.5f})));
  EXPECT_THROW(s->truncate(5), ucpkit::Error);  // no growth
  auto b = s->reinterpret(DType::Int32);  // a copy of the four elements' bytes
  EXPECT_EQ(b->bytes().size(), 16u);
  auto owned = ucpkit::Storage::owned(DType::Float32, std::vector<uint8_t>(12, 0));
  owned->truncate(1);
  EXPECT_EQ(owned->bytes().size(), 4u);
  EXPECT_THROW(ucpkit::Storage::generated(DType::Float32, 2, [](uint64_t, std::span<uint8_t>) {})->truncate(1), ucpkit::Error);
}

}  // namespace
}  // namespace iotest
