// lib/io/tensor: Storage (owned, zeros, uninitialized, mapped, unbound + bind, generated, reinterpret,
// truncate) and Tensor (views and their checks, contiguity, copies, to, narrow, reshape, equal, cat).
// TensorOperations.* (moved here from tensor_ops_test.cpp) compare against torch's results: inputs and
// expected outputs are built from the JSON truth of ops.pt alone (owned storages), not through the
// reader. Storage.* and Tensor.* use values worked out by hand.
#include <numeric>

#include "core/mapped_file.h"
#include "support/errors.h"
#include "truth_check.h"

namespace iotest {
namespace tensor_test {
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
    std::string what = "narrow(" + std::to_string(dim) + ", " + std::to_string(start) + ", " + std::to_string(len) +
                       ")";
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
  auto b = s->reinterpret(DType::Int32);        // a copy of the four elements' bytes
  EXPECT_EQ(b->bytes().size(), 16u);
  auto owned = ucpkit::Storage::owned(DType::Float32, std::vector<uint8_t>(12, 0));
  owned->truncate(1);
  EXPECT_EQ(owned->bytes().size(), 4u);
  EXPECT_THROW(ucpkit::Storage::generated(DType::Float32, 2, [](uint64_t, std::span<uint8_t>) {})->truncate(1),
               ucpkit::Error);
}

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> b(n);
  std::iota(b.begin(), b.end(), uint8_t{0});
  return b;
}

std::string thrown(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

bool has(const std::string& msg, const std::string& words) { return msg.find(words) != std::string::npos; }

TEST(Storage, OwnedAndZerosHoldTheirBytes) {
  auto s = ucpkit::Storage::owned(DType::Int16, iota_bytes(6));
  EXPECT_EQ(s->numel(), 3);
  EXPECT_EQ(s->nbytes(), 6u);
  EXPECT_FALSE(s->is_mapped());
  EXPECT_FALSE(s->is_generated());
  EXPECT_TRUE(s->is_bound());
  s->mutable_bytes()[0] = 9;
  EXPECT_EQ(s->bytes()[0], 9);
  auto z = ucpkit::Storage::zeros(DType::Float64, 2);
  EXPECT_EQ(z->nbytes(), 16u);
  for (auto b : z->bytes()) EXPECT_EQ(b, 0);
  EXPECT_TRUE(
      has(thrown([] { ucpkit::Storage::owned(DType::Float32, iota_bytes(6)); }), "not a multiple of the element size"));
  EXPECT_TRUE(has(thrown([] { ucpkit::Storage::uninitialized(DType::Float32, -1); }), "negative storage size"));
}

TEST(Storage, MappedStoragesAreReadOnlyViewsOfTheFile) {
  auto file = ucpkit::MappedFile::from_bytes(iota_bytes(32), "m.bin");
  auto s = ucpkit::Storage::mapped(DType::Int32, 2, file, 8);
  EXPECT_TRUE(s->is_mapped());
  ASSERT_EQ(s->bytes().size(), 8u);
  EXPECT_EQ(s->bytes()[0], 8);
  EXPECT_EQ(s->bytes()[7], 15);
  EXPECT_TRUE(has(thrown([&] { s->mutable_bytes(); }), "memory-mapped read-only"));
  EXPECT_TRUE(has(thrown([&] { s->truncate(1); }), "is not owned: it cannot be truncated"));
  const std::string msg = thrown([&] { ucpkit::Storage::mapped(DType::Int32, 7, file, 8); });
  EXPECT_EQ(msg, "m.bin: storage of 28 bytes at offset 8 runs past the end of the file");
  EXPECT_TRUE(has(thrown([&] { ucpkit::Storage::mapped(DType::Int32, 0, file, 33); }), "runs past the end"));
  EXPECT_TRUE(
      has(thrown([&] { ucpkit::Storage::mapped(DType::Int64, INT64_MAX / 4, file, 0); }), "size overflow in storage"));
}

TEST(Storage, UnboundStoragesHaveNoBytesUntilBound) {
  auto file = ucpkit::MappedFile::from_bytes(iota_bytes(16), "legacy.pt");
  auto s = ucpkit::Storage::unbound(DType::Float16, 4);
  s->key = "7";
  EXPECT_FALSE(s->is_bound());
  EXPECT_EQ(thrown([&] { s->bytes(); }), "storage '7' has no data");
  EXPECT_TRUE(has(thrown([&] { s->reinterpret(DType::UInt8); }), "cannot reinterpret a generated or unbound storage"));
  EXPECT_EQ(thrown([&] { s->bind(file, 10); }),
            "legacy.pt: storage '7' of 8 bytes at offset 10 runs past the end of the file");
  s->bind(file, 8);
  EXPECT_TRUE(s->is_bound());
  EXPECT_EQ(s->bytes()[0], 8);
  EXPECT_EQ(s->bytes().size(), 8u);
}

TEST(Storage, GeneratedStoragesProduceWholeElementsOnly) {
  std::vector<std::pair<uint64_t, size_t>> asked;
  auto g = ucpkit::Storage::generated(DType::Float32, 4, [&](uint64_t off, std::span<uint8_t> out) {
    asked.emplace_back(off, out.size());
    for (size_t k = 0; k < out.size(); ++k) out[k] = static_cast<uint8_t>(off + k);
  });
  g->key = "g";
  EXPECT_TRUE(g->is_generated());
  std::vector<uint8_t> w(8);
  g->generate(4, w);
  EXPECT_EQ(w[0], 4);
  EXPECT_EQ(w[7], 11);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0], (std::pair<uint64_t, size_t>{4, 8}));
  EXPECT_TRUE(has(thrown([&] { g->generate(2, w); }), "bytes [2, +8) are not whole elements inside the storage"));
  EXPECT_TRUE(has(thrown([&] { g->generate(12, w); }), "bytes [12, +8)"));
  EXPECT_TRUE(has(thrown([&] { g->bytes(); }), "storage 'g' is generated on demand"));
  EXPECT_TRUE(has(thrown([&] { g->mutable_bytes(); }), "generated on demand, it has no bytes"));
  auto owned = ucpkit::Storage::zeros(DType::Float32, 1);
  owned->key = "o";
  EXPECT_EQ(thrown([&] { owned->generate(0, w); }), "storage 'o' is not generated");
  EXPECT_TRUE(has(thrown([] { ucpkit::Storage::generated(DType::Float32, 1, nullptr); }), "without a generator"));
}

TEST(Storage, ReinterpretKeepsTheBytesUnderAnotherElementType) {
  auto s = ucpkit::Storage::owned(DType::UInt8, {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40});
  s->key = "k";
  s->location = "cuda:1";
  EXPECT_EQ(s->reinterpret(DType::UInt8), s);  // same dtype: itself
  auto f = s->reinterpret(DType::Float32);
  EXPECT_EQ(f->numel(), 2);
  EXPECT_EQ(f->key, "k");
  EXPECT_EQ(f->location, "cuda:1");
  EXPECT_EQ(Tensor(f, 0, {2}, {1}).to_vector<float>(), (std::vector<float>{1.0f, 2.0f}));
  auto three = ucpkit::Storage::owned(DType::UInt8, {1, 2, 3});
  EXPECT_TRUE(
      has(thrown([&] { three->reinterpret(DType::Int16); }), "storage of 3 bytes is not a whole number of int16"));
  auto file = ucpkit::MappedFile::from_bytes(iota_bytes(8), "f");
  auto m = ucpkit::Storage::mapped(DType::UInt8, 8, file, 0)->reinterpret(DType::Int64);
  EXPECT_TRUE(m->is_mapped());
  EXPECT_EQ(m->numel(), 1);
}

TEST(Tensor, ViewsAreCheckedAgainstTheirStorage) {
  auto s = ucpkit::Storage::zeros(DType::Float32, 10);
  Tensor ok(s, 4, {2, 3}, {3, 1});  // last element 4 + 3 + 2 = 9
  EXPECT_EQ(ok.numel(), 6);
  EXPECT_EQ(ok.nbytes(), 24u);
  EXPECT_EQ(ok.dim(), 2);
  EXPECT_TRUE(ok.is_contiguous());
  EXPECT_TRUE(has(thrown([&] { Tensor(s, 5, {2, 3}, {3, 1}); }), "tensor view (offset 5, extent 6"));
  EXPECT_TRUE(has(thrown([&] { Tensor(s, 0, {2}, {1, 1}); }), "tensor has 1 sizes but 2"));
  EXPECT_EQ(thrown([&] { Tensor(s, -1, {1}, {1}); }), "negative storage offset");
  EXPECT_EQ(thrown([&] { Tensor(s, 0, {-1}, {1}); }), "negative tensor size");
  EXPECT_EQ(thrown([&] { Tensor(s, 0, {2}, {-1}); }), "negative tensor stride");
  EXPECT_EQ(thrown([&] { Tensor(nullptr, 0, {1}, {1}); }), "tensor without storage");
  EXPECT_TRUE(has(thrown([&] { Tensor(s, 0, {INT64_MAX, 2}, {2, 1}); }), "size overflow"));
  // A zero-element view fits any storage, however far its offset.
  EXPECT_EQ(Tensor(s, 10, {0, 5}, {5, 1}).numel(), 0);
}

TEST(Tensor, ContiguousStridesAndZerosAndFromBytes) {
  EXPECT_EQ(Tensor::contiguous_strides({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(Tensor::contiguous_strides({}), (std::vector<int64_t>{}));
  Tensor z = Tensor::zeros(DType::BFloat16, {3, 2});
  EXPECT_EQ(z.strides(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(z.nbytes(), 12u);
  Tensor scalar = Tensor::zeros(DType::Float64, {});
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(thrown([] { Tensor::from_bytes(DType::Float32, {2}, iota_bytes(4)); }),
            "tensor data size does not match its shape");
}

TEST(Tensor, StridedViewsCopyInLogicalOrder) {
  // Storage 0..11 (int8) read as a transposed 3x4 -> 4x3 view with strides (1, 4), offset 0.
  auto s = ucpkit::Storage::owned(DType::Int8, iota_bytes(12));
  Tensor t(s, 0, {4, 3}, {1, 4});
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_TRUE(has(thrown([&] { t.contiguous_bytes(); }), "tensor is not contiguous"));
  EXPECT_EQ(t.to_vector<int8_t>(), (std::vector<int8_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), s);
  // A contiguous tensor is itself unless a copy is forced.
  Tensor base(s, 0, {12}, {1});
  EXPECT_EQ(base.contiguous().storage(), s);
  EXPECT_NE(base.contiguous(true).storage(), s);
  // narrow of the view: rows 1..2 of column-major data, then reshape copies in logical order.
  Tensor n = t.narrow(0, 1, 2);
  EXPECT_EQ(n.storage_offset(), 1);
  EXPECT_EQ(n.storage(), s);
  EXPECT_EQ(n.reshape({6}).to_vector<int8_t>(), (std::vector<int8_t>{1, 5, 9, 2, 6, 10}));
  EXPECT_EQ(thrown([&] { t.narrow(2, 0, 1); }), "narrow: dimension out of range");
  EXPECT_EQ(thrown([&] { t.narrow(0, 3, 2); }), "narrow: range out of bounds");
  EXPECT_EQ(thrown([&] { t.reshape({5}); }), "reshape: element count differs");
}

TEST(Tensor, ToRefusesIntegerDtypes) {
  Tensor i = Tensor::zeros(DType::Int32, {2});
  EXPECT_TRUE(has(thrown([&] { i.to(DType::Float32); }), "conversion supports floating dtypes only (int32 -> float32"));
  // 1 + 2^-11 is a float16 tie: rounds to even (1.0); 1 + 3 * 2^-11 rounds up to 1 + 2^-9.
  Tensor f = Tensor::from_vector<float>(DType::Float32, {2}, std::vector<float>{1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f});
  Tensor h = f.to(DType::Float16);
  EXPECT_EQ(h.to_vector<uint16_t>(), (std::vector<uint16_t>{0x3c00, 0x3c02}));
}

TEST(Tensor, CatJoinsAlongAnyDimensionAndChecksShapes) {
  Tensor a = Tensor::from_vector<int16_t>(DType::Int16, {2, 2}, std::vector<int16_t>{1, 2, 3, 4});
  Tensor b = Tensor::from_vector<int16_t>(DType::Int16, {2, 1}, std::vector<int16_t>{5, 6});
  EXPECT_EQ(ucpkit::cat({a, b}, 1).to_vector<int16_t>(), (std::vector<int16_t>{1, 2, 5, 3, 4, 6}));
  EXPECT_EQ(ucpkit::cat({a, a}, 0).shape(), (std::vector<int64_t>{4, 2}));
  Tensor empty = Tensor::zeros(DType::Int16, {2, 0});
  EXPECT_EQ(ucpkit::cat({empty, b}, 1).to_vector<int16_t>(), (std::vector<int16_t>{5, 6}));
  EXPECT_EQ(thrown([] { ucpkit::cat({}, 0); }), "cat: no tensors");
  EXPECT_EQ(thrown([&] { ucpkit::cat({a, b}, 0); }), "cat: shape mismatch");
  EXPECT_EQ(thrown([&] { ucpkit::cat({a, b}, 2); }), "cat: dimension out of range");
  EXPECT_EQ(thrown([&] { ucpkit::cat({a, Tensor::zeros(DType::Int32, {2, 2})}, 0); }), "cat: dtype or rank mismatch");
}

}  // namespace
}  // namespace tensor_test
}  // namespace iotest
