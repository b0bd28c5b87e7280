// LibTorch interop, and our dtype conversion checked against ATen's as independent truth.
#include "torch_bridge/torch_bridge.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

namespace torch_bridge_test {

using namespace ucpkit;

namespace {
// fp32 values covering normals, subnormals, ties, overflow, infinities and NaN.
std::vector<float> tricky_floats() {
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65520.0f, 70000.0f, 1e-8f, 5.96e-8f, 2.98e-8f,
                          6.1e-5f, 3.0e38f, std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::denorm_min()};
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int k = 0; k < 200000; ++k) {
    float f = std::bit_cast<float>(bits(rng));
    v.push_back(f);
  }
  // exact ties for bf16 and fp16 rounding
  for (uint32_t base : {0x3f800000u, 0x3f810000u, 0x40000000u, 0x387fc000u})
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0x1000u, 0x0fffu, 0x1001u, 0x3000u})
      v.push_back(std::bit_cast<float>(base | low));
  return v;
}
}  // namespace

TEST(TorchBridge, ConversionMatchesATen) {
  auto values = tricky_floats();
  Tensor ours = Tensor::from_vector(DType::Float32, {static_cast<int64_t>(values.size())}, values);
  at::Tensor theirs = torch_bridge::to_aten(ours);
  for (DType target : {DType::BFloat16, DType::Float16, DType::Float64}) {
    Tensor a = ours.to(target);
    at::Tensor b = theirs.to(torch_bridge::to_scalar_type(target)).contiguous();
    ASSERT_EQ(a.nbytes(), static_cast<uint64_t>(b.nbytes()));
    auto ab = a.contiguous_bytes();
    const uint8_t* bb = static_cast<const uint8_t*>(b.data_ptr());
    size_t es = dtype_size(target);
    size_t mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::isnan(values[i])) continue;  // NaN payloads may differ; NaN-ness is checked below
      if (std::memcmp(ab.data() + i * es, bb + i * es, es) != 0 && ++mismatches < 5)
        ADD_FAILURE() << dtype_name(target) << " mismatch for fp32 bits " << std::hex
                      << std::bit_cast<uint32_t>(values[i]);
    }
    EXPECT_EQ(mismatches, 0u) << dtype_name(target);
    // And back to fp32.
    Tensor back = a.to(DType::Float32);
    at::Tensor tback = b.to(at::kFloat).contiguous();
    auto x = back.to_vector<float>();
    for (size_t i = 0; i < x.size(); ++i) {
      float y = tback.data_ptr<float>()[i];
      if (std::isnan(y)) {
        EXPECT_TRUE(std::isnan(x[i]));
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(y)) << i;
      }
    }
  }
}

TEST(TorchBridge, StridedViewsRoundTrip) {
  at::Tensor base = at::arange(60, at::kFloat).reshape({3, 4, 5});
  at::Tensor view = base.transpose(0, 2).narrow(1, 1, 2);
  Tensor ours = torch_bridge::from_aten(view);
  EXPECT_EQ(ours.shape(), (std::vector<int64_t>{5, 2, 3}));
  at::Tensor back = torch_bridge::to_aten(ours);
  EXPECT_TRUE(at::equal(back, view));
  // A view over one of our storages is seen by ATen with the same strides and offset.
  Tensor narrowed = ours.narrow(0, 1, 3);
  at::Tensor an = torch_bridge::to_aten(narrowed);
  EXPECT_TRUE(at::equal(an, view.narrow(0, 1, 3)));
  EXPECT_EQ(torch_bridge::from_aten(an).to_vector<float>(), narrowed.to_vector<float>());
}

TEST(TorchBridge, CatAndNarrowMatchATen) {
  at::Tensor a = at::randn({4, 6}).to(at::kBFloat16), b = at::randn({4, 2}).to(at::kBFloat16);
  Tensor ca = cat({torch_bridge::from_aten(a), torch_bridge::from_aten(b)}, 1);
  EXPECT_TRUE(at::equal(torch_bridge::to_aten(ca), at::cat({a, b}, 1)));
  Tensor c0 = cat({torch_bridge::from_aten(a.t()), torch_bridge::from_aten(b.t())}, 0);
  EXPECT_TRUE(at::equal(torch_bridge::to_aten(c0), at::cat({a.t(), b.t()}, 0)));
}

}  // namespace torch_bridge_test
