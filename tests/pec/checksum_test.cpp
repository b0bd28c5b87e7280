// pec/checksum.h: XXH64 against the algorithm's published values and a plain reference written here
// from its specification (bytes read one at a time, little-endian by hand), the store's 128-bit digest
// and its hex form, the streaming forms, and DigestChain's whole-file checksum (a format manifests keep).
// (Xxh64KnownValue and StreamingDigestsEqualOneShot moved here from store_test.cpp and
// restore_writer_test.cpp.)
#include "pec/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace checksum_test {

using namespace ucpkit::pec;

namespace {
// XXH64 from its specification (xxhash_spec.md), as plainly as possible.
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                   kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;
uint64_t rot(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
uint64_t le(const std::string& s, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(s[at + static_cast<size_t>(i)]);
  return v;
}
uint64_t lane(uint64_t acc, uint64_t in) { return rot(acc + in * kP2, 31) * kP1; }
uint64_t reference_xxh64(const std::string& s, uint64_t seed) {
  size_t i = 0;
  uint64_t h;
  if (s.size() >= 32) {
    uint64_t v[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
    for (; i + 32 <= s.size(); i += 32)
      for (int k = 0; k < 4; ++k) v[k] = lane(v[k], le(s, i + 8 * static_cast<size_t>(k), 8));
    h = rot(v[0], 1) + rot(v[1], 7) + rot(v[2], 12) + rot(v[3], 18);
    for (int k = 0; k < 4; ++k) h = (h ^ lane(0, v[k])) * kP1 + kP4;
  } else {
    h = seed + kP5;
  }
  h += s.size();
  for (; i + 8 <= s.size(); i += 8) h = rot(h ^ lane(0, le(s, i, 8)), 27) * kP1 + kP4;
  if (i + 4 <= s.size()) h = rot(h ^ (le(s, i, 4) * kP1), 23) * kP2 + kP3, i += 4;
  for (; i < s.size(); ++i) h = rot(h ^ (le(s, i, 1) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

std::string hex2(uint64_t hi, uint64_t lo) {
  char b[40];
  std::snprintf(b, sizeof b, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return b;
}

std::string random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::span<const uint8_t> span_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// The seed of the digest's high half: "PECSTRE1" (pec/checksum.cpp; objects on disk are named by it).
constexpr uint64_t kSeedHi = 0x5045435354524531ull;
}  // namespace

TEST(PecChecksum, Xxh64KnownValue) {
  EXPECT_EQ(xxh64("", 0, 0), 0xEF46DB3751D8E999ull);  // reference value of XXH64("", seed 0)
  EXPECT_NE(digest(std::string_view("a")).hex(), digest(std::string_view("b")).hex());
  EXPECT_EQ(digest(std::string_view("abc")).hex().size(), 32u);
}

TEST(PecChecksum, StreamingDigestsEqualOneShot) {
  std::mt19937_64 rng(7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{1000}, size_t{100003}}) {
    std::vector<uint8_t> data(n);
    for (auto& c : data) c = static_cast<uint8_t>(rng());
    Xxh64 h(12345);
    DigestStream d;
    for (size_t pos = 0; pos < n;) {
      size_t k = std::min<size_t>(n - pos, rng() % 97);
      h.update(data.data() + pos, k);
      d.update({data.data() + pos, k});
      pos += k;
    }
    EXPECT_EQ(h.value(), xxh64(data.data(), n, 12345)) << n;
    EXPECT_EQ(d.value(), digest(std::span<const uint8_t>(data))) << n;
    DigestChain a, b;
    a.update(std::span<const uint8_t>(data));
    b.update(digest(std::span<const uint8_t>(data)), n);
    EXPECT_EQ(a.hex(), b.hex());
  }
}

TEST(PecChecksum, Xxh64PublishedValues) {
  EXPECT_EQ(xxh64("a", 1, 0), 0xD24EC4F1A98C6E5Bull);
  EXPECT_EQ(xxh64("abc", 3, 0), 0x44BC2CF5AD770999ull);
  const std::string nobody = "Nobody inspects the spammish repetition";  // 39 bytes: the four-lane path
  EXPECT_EQ(xxh64(nobody.data(), nobody.size(), 0), 0xFBCEA83C8A378BF1ull);
  EXPECT_EQ(xxh64("xxhash", 6, 0), 0x32DD38952C4BC720ull);
  EXPECT_EQ(xxh64("xxhash", 6, 20141025), 0xB559B98D844E0635ull);
}

TEST(PecChecksum, Xxh64EqualsTheReferenceAtEveryTailLengthAndSeed) {
  for (uint64_t seed : std::vector<uint64_t>{0, 1, kSeedHi, ~uint64_t{0}})
    for (size_t n = 0; n <= 100; ++n) {
      const std::string s = random_bytes(n, n + 17);
      EXPECT_EQ(xxh64(s.data(), n, seed), reference_xxh64(s, seed)) << n << " " << seed;
    }
  const std::string big = random_bytes(100003, 5);
  EXPECT_EQ(xxh64(big.data(), big.size(), 3), reference_xxh64(big, 3));
  EXPECT_EQ(reference_xxh64("abc", 0), 0x44BC2CF5AD770999ull);  // the reference itself, on a published value
}

TEST(PecChecksum, DigestIsTwoSeededXxh64sWrittenAs32HexDigitsHighFirst) {
  for (const std::string s : {std::string(), std::string("abc"), random_bytes(1000, 9)}) {
    const Digest d = digest(span_of(s));
    EXPECT_EQ(d.hi, reference_xxh64(s, kSeedHi));
    EXPECT_EQ(d.lo, reference_xxh64(s, 0));
    EXPECT_EQ(d.hex(), hex2(d.hi, d.lo));
    EXPECT_EQ(digest(std::string_view(s)), d);
  }
  EXPECT_EQ(digest(std::string_view()).hex().substr(16), "ef46db3751d8e999");  // XXH64("", 0)
  EXPECT_EQ((Digest{1, 0xabc}).hex(), "00000000000000010000000000000abc");
  EXPECT_FALSE((Digest{1, 2}) == (Digest{2, 1}));
}

TEST(PecChecksum, DigestChainIsItsDocumentedFold) {
  // Nothing chained: the two starting constants.
  EXPECT_EQ(DigestChain().hex(), "9e3779b97f4a7c15c2b2ae3d27d4eb4f");
  // Each piece folds its digest's 16 bytes (hi, then lo, little-endian) into both halves; the high half
  // is xored with the byte count at the end.
  const std::vector<std::string> pieces = {"first piece", "", random_bytes(70, 2)};
  uint64_t a = 0x9E3779B97F4A7C15ull, b = 0xC2B2AE3D27D4EB4Full, n = 0;
  DigestChain chain;
  for (const auto& p : pieces) {
    const Digest d = digest(span_of(p));
    std::string raw;
    for (uint64_t w : {d.hi, d.lo})
      for (int i = 0; i < 8; ++i) raw += static_cast<char>(w >> (8 * i));
    a = reference_xxh64(raw, a) ^ rot(a, 17);
    b = reference_xxh64(raw, b + n);
    n += p.size();
    chain.update(span_of(p));
  }
  EXPECT_EQ(chain.hex(), hex2(a ^ n, b));
  // Not a digest of the concatenation: the pieces' order and boundaries count.
  DigestChain swapped, joined;
  swapped.update(span_of(pieces[2]));
  swapped.update(span_of(pieces[1]));
  swapped.update(span_of(pieces[0]));
  joined.update(span_of(pieces[0] + pieces[1] + pieces[2]));
  EXPECT_NE(swapped.hex(), chain.hex());
  EXPECT_NE(joined.hex(), chain.hex());
}

}  // namespace checksum_test
