// CRC-32 by folding with carry-less multiplication (Gopal et al., "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ Instruction", Intel 2009), bit-reflected constants for the zip
// polynomial 0x04C11DB7. Four 128-bit lanes fold 64 bytes per step; the tail (< 16 bytes, or inputs
// under 64 bytes) goes through zlib. Tested against zlib on random lengths and alignments.
#include "core/crc32.h"

#include <tbb/parallel_for.h>
#include <zlib.h>

#include <algorithm>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define UCPKIT_CRC_PCLMUL 1
#endif

namespace ucpkit {
namespace {

uint32_t crc32_zlib(uint32_t crc, const uint8_t* p, size_t n) {
  return static_cast<uint32_t>(::crc32_z(crc, p, n));
}

#ifdef UCPKIT_CRC_PCLMUL
// Folding constants: x^(k) mod P(x) for the distances used below, bit-reflected, as 33-bit values.
alignas(16) constexpr uint64_t kFold64[2] = {0x0154442bd4, 0x01c6e41596};   // fold by 4 x 128 bits
alignas(16) constexpr uint64_t kFold16[2] = {0x01751997d0, 0x00ccaa009e};   // fold by 128 bits
alignas(16) constexpr uint64_t kFold96[2] = {0x0163cd6124, 0};              // 64 -> 32 bits
alignas(16) constexpr uint64_t kBarrett[2] = {0x01db710641, 0x01f7011641};  // P'(x), mu

// Multiplies both 64-bit halves of `acc` by the two constants and adds `data`: one fold step.
__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i acc, __m128i k, __m128i data) {
  const __m128i lo = _mm_clmulepi64_si128(acc, k, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(acc, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), data);
}

// Raw CRC state (pre-inverted) over n bytes, n >= 64 and a multiple of 16.
__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_fold(uint32_t state, const uint8_t* p, size_t n) {
  auto load = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i a = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(state)));
  __m128i b = load(p + 16), c = load(p + 32), d = load(p + 48);
  p += 64;
  n -= 64;
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFold64));
  for (; n >= 64; p += 64, n -= 64) {
    a = fold(a, k, load(p));
    b = fold(b, k, load(p + 16));
    c = fold(c, k, load(p + 32));
    d = fold(d, k, load(p + 48));
  }
  // Four lanes into one, then the remaining 16-byte blocks.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kFold16));
  a = fold(a, k, b);
  a = fold(a, k, c);
  a = fold(a, k, d);
  for (; n >= 16; p += 16, n -= 16) a = fold(a, k, load(p));
  // 128 -> 64 bits.
  const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
  a = _mm_xor_si128(_mm_srli_si128(a, 8), _mm_clmulepi64_si128(a, k, 0x10));
  // 64 -> 32 bits (in the high half).
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kFold96));
  a = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(a, mask32), k, 0x00), _mm_srli_si128(a, 4));
  // Barrett reduction to the 32-bit remainder.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(kBarrett));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(a, mask32), k, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), k, 0x00);
  a = _mm_xor_si128(a, t);
  return static_cast<uint32_t>(_mm_extract_epi32(a, 1));
}

const bool kHavePclmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
const bool kHavePclmul = false;
#endif

constexpr size_t kParallelChunk = 8 << 20;

}  // namespace

bool crc32_accelerated() { return kHavePclmul; }

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data) {
  const uint8_t* p = data.data();
  size_t n = data.size();
#ifdef UCPKIT_CRC_PCLMUL
  if (kHavePclmul && n >= 64) {
    const size_t bulk = n & ~size_t{15};
    crc = ~crc32_fold(~crc, p, bulk);
    p += bulk;
    n -= bulk;
  }
#endif
  return n ? crc32_zlib(crc, p, n) : crc;
}

uint32_t crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return static_cast<uint32_t>(::crc32_combine64(crc_a, crc_b, static_cast<z_off64_t>(len_b)));
}

uint32_t crc32_zeros(uint64_t n) {
  // zeros(a + b) = combine(zeros(a), zeros(b), b): the set bits of n, each a power of two made by doubling.
  const uint8_t zero = 0;
  uint32_t result = 0, power = crc32_update(0, {&zero, 1});
  for (uint64_t len = 1; n; n >>= 1) {
    if (n & 1) result = crc32_combine(result, power, len);
    if (n > 1) power = crc32_combine(power, power, len), len <<= 1;
  }
  return result;
}

uint32_t crc32_parallel(std::span<const uint8_t> data, uint32_t crc) {
  if (data.size() <= kParallelChunk) return crc32_update(crc, data);
  const size_t n = (data.size() + kParallelChunk - 1) / kParallelChunk;
  std::vector<uint32_t> part(n);
  tbb::parallel_for(size_t{0}, n, [&](size_t k) {
    const size_t off = k * kParallelChunk;
    part[k] = crc32_update(0, data.subspan(off, std::min(kParallelChunk, data.size() - off)));
  });
  for (size_t k = 0; k < n; ++k)
    crc = crc32_combine(crc, part[k], std::min(kParallelChunk, data.size() - k * kParallelChunk));
  return crc;
}

}  // namespace ucpkit
