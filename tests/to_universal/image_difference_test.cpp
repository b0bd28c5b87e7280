// to_universal/image_difference: the module weight as the rounded fp32 master, in blocks (a block that
// matches is skipped by the branch-free rounding; one that does not is searched element by element).
#include "to_universal/image_difference.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "io/dtype.h"

namespace image_difference_test {

using namespace ucpkit;
using ucpkit::to_universal::first_image_difference;

namespace {

// n masters of varied magnitude and sign, some exactly halfway between two bf16 values (ties to even).
std::vector<float> masters(int64_t n) {
  std::vector<float> m(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t tie = 0x3f800000u + (static_cast<uint32_t>(i) << 16) % 0x00800000u + 0x8000u;
    m[static_cast<size_t>(i)] = i % 7 == 0 ? std::bit_cast<float>(tie) : std::sin(0.37f * static_cast<float>(i)) * 1e3f;
  }
  return m;
}

Tensor bf16_image(const std::vector<float>& m) {
  std::vector<uint16_t> s;
  for (float f : m) s.push_back(f32_to_bf16(f));
  return Tensor::from_vector(DType::BFloat16, {static_cast<int64_t>(s.size())}, s);
}

}  // namespace

TEST(ImageDifference, TheRoundedMasterHasNoDifference) {
  for (int64_t n : {0, 1, 15, 4096, 4097, 3 * 4096 + 5}) {
    const auto m = masters(n);
    uint32_t stored = 0, image = 0;
    EXPECT_EQ(first_image_difference(m.data(), n, bf16_image(m), &stored, &image), -1) << n;
  }
}

TEST(ImageDifference, FindsTheFirstDifferenceInALaterBlock) {
  const int64_t n = 3 * 4096 + 5;
  const auto m = masters(n);
  for (int64_t at : {int64_t{0}, int64_t{4095}, int64_t{4096}, int64_t{2 * 4096 + 17}, n - 1}) {
    std::vector<uint16_t> s = bf16_image(m).to_vector<uint16_t>();
    s[static_cast<size_t>(at)] ^= 1;  // one ulp: the smallest difference there is
    s[static_cast<size_t>(n - 1)] ^= at == n - 1 ? 0 : 2;
    uint32_t stored = 0, image = 0;
    EXPECT_EQ(first_image_difference(m.data(), n, Tensor::from_vector(DType::BFloat16, {n}, s), &stored, &image), at);
    EXPECT_EQ(stored, s[static_cast<size_t>(at)]);
    EXPECT_EQ(image, f32_to_bf16(m[static_cast<size_t>(at)]));
  }
}

// A NaN fails the branch-free rounding, so its block is searched element by element, where any NaN agrees
// with any NaN (torch drops a NaN's sign, other converters keep it); a later difference is still found.
TEST(ImageDifference, NanAgreesWithAnyNanAndTheSearchGoesOn) {
  const int64_t n = 2 * 4096;
  auto m = masters(n);
  m[10] = -std::numeric_limits<float>::quiet_NaN();
  std::vector<uint16_t> s = bf16_image(m).to_vector<uint16_t>();
  s[10] = 0x7fc0;  // torch's NaN, sign dropped
  uint32_t stored = 0, image = 0;
  EXPECT_EQ(first_image_difference(m.data(), n, Tensor::from_vector(DType::BFloat16, {n}, s), &stored, &image), -1);
  s[4100] ^= 1;
  EXPECT_EQ(first_image_difference(m.data(), n, Tensor::from_vector(DType::BFloat16, {n}, s), &stored, &image), 4100);
}

TEST(ImageDifference, Float32WeightsAreTheMasterItself) {
  const int64_t n = 4096 + 3;
  auto m = masters(n);
  m[5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> w = m;
  w[5] = -std::numeric_limits<float>::quiet_NaN();
  uint32_t stored = 0, image = 0;
  EXPECT_EQ(first_image_difference(m.data(), n, Tensor::from_vector(DType::Float32, {n}, w), &stored, &image), -1);
  w[4097] = std::nextafter(w[4097], 1e9f);
  EXPECT_EQ(first_image_difference(m.data(), n, Tensor::from_vector(DType::Float32, {n}, w), &stored, &image), 4097);
}

TEST(ImageDifference, Float16UsesTorchsConversion) {
  const int64_t n = 100;
  std::vector<float> m(n);
  for (int64_t i = 0; i < n; ++i) m[static_cast<size_t>(i)] = 0.001f * static_cast<float>(i * i);
  std::vector<uint8_t> b(static_cast<size_t>(n) * 4);
  std::memcpy(b.data(), m.data(), b.size());
  Tensor h = Tensor::from_bytes(DType::Float32, {n}, std::move(b)).to(DType::Float16);
  uint32_t stored = 0, image = 0;
  EXPECT_EQ(first_image_difference(m.data(), n, h, &stored, &image), -1);
  std::vector<uint16_t> s = h.to_vector<uint16_t>();
  s[42] ^= 1;
  EXPECT_EQ(first_image_difference(m.data(), n, Tensor::from_vector(DType::Float16, {n}, s), &stored, &image), 42);
}

}  // namespace image_difference_test
