// core/crc32 against zlib's crc32() (the independent reference): every length 0..300 and some large
// buffers at odd offsets, the parallel split, and crc32_combine's algebra.
#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <vector>

#include "core/crc32.h"
#include "core/error.h"

namespace crc32_test {

using namespace ucpkit;

namespace {

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

uint32_t zlib_crc(const uint8_t* p, size_t n, uint32_t crc = 0) {
  // zlib takes uInt lengths: feed large buffers in pieces.
  while (n > 0) {
    size_t take = std::min<size_t>(n, 1u << 30);
    crc = static_cast<uint32_t>(::crc32(crc, p, static_cast<uInt>(take)));
    p += take;
    n -= take;
  }
  return crc;
}

}  // namespace

TEST(Crc32, EveryShortLengthAndOffsetEqualsZlib) {
  auto data = random_bytes(400, 1);
  for (size_t off = 0; off < 17; ++off)
    for (size_t n = 0; n + off <= 300; ++n)
      ASSERT_EQ(crc32_update(0, {data.data() + off, n}), zlib_crc(data.data() + off, n)) << "offset " << off << " length " << n;
}

// Each kernel this CPU has, on every length 0..1,100 (the wide kernel's 256-byte steps, its fold to 64 bytes and the
// 128-bit tail) at every offset of a 64-byte line, and on large buffers continued from another CRC.
TEST(Crc32, EveryKernelEqualsZlib) {
  auto data = random_bytes(1200, 5);
  auto large = random_bytes((4u << 20) + 77, 6);
  for (Crc32Kernel k : {Crc32Kernel::zlib, Crc32Kernel::pclmul, Crc32Kernel::vpclmul}) {
    if (!crc32_kernel_available(k)) {
      EXPECT_THROW(crc32_update_kernel(k, 0, {data.data(), 1}), Error);
      continue;
    }
    SCOPED_TRACE(static_cast<int>(k));
    for (size_t off = 0; off < 64; off += 9)
      for (size_t n = 0; n + off <= 1100; ++n)
        ASSERT_EQ(crc32_update_kernel(k, 0, {data.data() + off, n}), zlib_crc(data.data() + off, n))
            << "offset " << off << " length " << n;
    const uint32_t start = zlib_crc(data.data(), 100);
    for (size_t off : {0, 3, 64}) {
      std::span<const uint8_t> s{large.data() + off, large.size() - off};
      EXPECT_EQ(crc32_update_kernel(k, start, s), zlib_crc(s.data(), s.size(), start)) << "offset " << off;
    }
  }
  EXPECT_TRUE(crc32_kernel_available(Crc32Kernel::zlib));
}

TEST(Crc32, LargeBuffersSerialAndParallelEqualZlib) {
  auto data = random_bytes((16u << 20) + 13, 2);
  for (size_t off : {0, 1, 7, 63}) {
    std::span<const uint8_t> s{data.data() + off, data.size() - off};
    uint32_t ref = zlib_crc(s.data(), s.size());
    EXPECT_EQ(crc32_update(0, s), ref);
    EXPECT_EQ(crc32_parallel(s), ref);
  }
}

TEST(Crc32, ContinuationAndCombineAgreeWithOnePass) {
  auto data = random_bytes(1 << 20, 3);
  std::mt19937 rng(4);
  for (int i = 0; i < 50; ++i) {
    size_t cut = rng() % data.size();
    std::span<const uint8_t> a{data.data(), cut}, b{data.data() + cut, data.size() - cut};
    uint32_t whole = zlib_crc(data.data(), data.size());
    EXPECT_EQ(crc32_update(crc32_update(0, a), b), whole);
    EXPECT_EQ(crc32_combine(crc32_update(0, a), crc32_update(0, b), b.size()), whole);
    EXPECT_EQ(crc32_parallel(b, crc32_update(0, a)), whole);
  }
}

TEST(Crc32, KnownCheckValue) {
  // The CRC-32 catalogue's check value for "123456789" (zip / gzip polynomial).
  const char* s = "123456789";
  EXPECT_EQ(crc32_update(0, {reinterpret_cast<const uint8_t*>(s), 9}), 0xCBF43926u);
}

TEST(Crc32, ZerosAsZlibSumsThem) {
  std::vector<uint8_t> zeros(3 << 20, 0);
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{63}, size_t{64}, size_t{4095}, size_t{65537},
                   size_t{1} << 20, (size_t{3} << 20) - 1, size_t{3} << 20})
    EXPECT_EQ(crc32_zeros(n), zlib_crc(zeros.data(), n)) << n;
}

}  // namespace crc32_test
