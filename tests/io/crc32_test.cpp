// The accelerated CRC-32 against zlib's (independent implementation) on random data, lengths,
// alignments and seeds, including the parallel and combine paths.
#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <vector>

#include "core/crc32.h"

namespace crc32_test {

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

uint32_t zlib_crc(uint32_t seed, const uint8_t* p, size_t n) { return static_cast<uint32_t>(crc32_z(seed, p, n)); }

TEST(Crc32, MatchesZlibOnRandomSpans) {
  const auto b = random_bytes(1 << 20, 7);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 4000; ++i) {
    const size_t off = rng() % 64;
    const size_t len = i < 2000 ? rng() % 300 : rng() % (b.size() - 64);
    const uint32_t seed = (i % 3 == 0) ? static_cast<uint32_t>(rng()) : 0;
    ASSERT_EQ(ucpkit::crc32_update(seed, {b.data() + off, len}), zlib_crc(seed, b.data() + off, len))
        << "offset " << off << " length " << len << " seed " << seed;
  }
}

TEST(Crc32, ParallelAndCombineMatchOnePass) {
  const auto b = random_bytes((40 << 20) + 12345, 3);
  const uint32_t whole = zlib_crc(0, b.data(), b.size());
  EXPECT_EQ(ucpkit::crc32_parallel(b), whole);
  const size_t cut = 17 << 20;
  const uint32_t a = ucpkit::crc32_update(0, {b.data(), cut});
  const uint32_t c = ucpkit::crc32_update(0, {b.data() + cut, b.size() - cut});
  EXPECT_EQ(ucpkit::crc32_combine(a, c, b.size() - cut), whole);
  EXPECT_EQ(ucpkit::crc32_parallel({b.data() + cut, b.size() - cut}, a), whole);
}

TEST(Crc32, KnownVector) {
  const std::string s = "123456789";  // the standard check value of CRC-32/ISO-HDLC
  EXPECT_EQ(ucpkit::crc32_update(0, {reinterpret_cast<const uint8_t*>(s.data()), s.size()}), 0xCBF43926u);
  std::vector<uint8_t> z(1000, 0);
  EXPECT_EQ(ucpkit::crc32_update(0, z), zlib_crc(0, z.data(), z.size()));
}

}  // namespace

}  // namespace crc32_test
