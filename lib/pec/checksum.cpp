// XXH64 (public algorithm by Yann Collet) and the store's 128-bit digests built from it.
#include "pec/checksum.h"

#include <cstdio>
#include <cstring>

namespace ucpkit::pec {
namespace {
constexpr uint64_t P1 = 11400714785074694791ull, P2 = 14029467366897019727ull, P3 = 1609587929392839161ull,
                   P4 = 9650029242287828579ull, P5 = 2870177450012600261ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline uint32_t read32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t round1(uint64_t acc, uint64_t in) {
  acc += in * P2;
  acc = rotl(acc, 31);
  return acc * P1;
}
inline uint64_t merge(uint64_t acc, uint64_t v) {
  acc ^= round1(0, v);
  return acc * P1 + P4;
}
std::string hex64(uint64_t hi, uint64_t lo) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi), static_cast<unsigned long long>(lo));
  return buf;
}

uint64_t finish(uint64_t h, const uint8_t* p, const uint8_t* end) {
  while (p + 8 <= end) {
    h ^= round1(0, read64(p));
    h = rotl(h, 27) * P1 + P4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(read32(p)) * P1;
    h = rotl(h, 23) * P2 + P3;
    p += 4;
  }
  while (p < end) {
    h ^= (*p) * P5;
    h = rotl(h, 11) * P1;
    ++p;
  }
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}
constexpr uint64_t kSeedHi = 0x5045435354524531ull;
}  // namespace

uint64_t xxh64(const void* data, size_t len, uint64_t seed) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
    const uint8_t* limit = end - 32;
    do {
      v1 = round1(v1, read64(p));
      v2 = round1(v2, read64(p + 8));
      v3 = round1(v3, read64(p + 16));
      v4 = round1(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    h = merge(h, v1);
    h = merge(h, v2);
    h = merge(h, v3);
    h = merge(h, v4);
  } else {
    h = seed + P5;
  }
  h += static_cast<uint64_t>(len);
  return finish(h, p, end);
}

Xxh64::Xxh64(uint64_t seed) : v_{seed + P1 + P2, seed + P2, seed, seed - P1}, seed_(seed) {}

void Xxh64::update(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  const uint8_t* end = p + n;
  total_ += n;
  if (buffered_ + n < 32) {
    std::memcpy(buf_ + buffered_, p, n);
    buffered_ += n;
    return;
  }
  if (buffered_) {
    size_t take = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, take);
    p += take;
    for (int i = 0; i < 4; ++i) v_[i] = round1(v_[i], read64(buf_ + 8 * i));
    buffered_ = 0;
  }
  while (p + 32 <= end) {
    v_[0] = round1(v_[0], read64(p));
    v_[1] = round1(v_[1], read64(p + 8));
    v_[2] = round1(v_[2], read64(p + 16));
    v_[3] = round1(v_[3], read64(p + 24));
    p += 32;
  }
  std::memcpy(buf_, p, static_cast<size_t>(end - p));
  buffered_ = static_cast<size_t>(end - p);
}

uint64_t Xxh64::value() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(v_[0], 1) + rotl(v_[1], 7) + rotl(v_[2], 12) + rotl(v_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, v_[i]);
  } else {
    h = seed_ + P5;
  }
  h += total_;
  return finish(h, buf_, buf_ + buffered_);
}

DigestStream::DigestStream() : hi_(kSeedHi), lo_(0) {}

void DigestStream::update(std::span<const uint8_t> b) {
  hi_.update(b.data(), b.size());
  lo_.update(b.data(), b.size());
}

std::string Digest::hex() const { return hex64(hi, lo); }

Digest digest(std::span<const uint8_t> b) {
  return {xxh64(b.data(), b.size(), kSeedHi), xxh64(b.data(), b.size(), 0)};
}
Digest digest(std::string_view t) {
  return digest(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(t.data()), t.size()));
}

void DigestChain::update(std::span<const uint8_t> bytes) { update(digest(bytes), bytes.size()); }

void DigestChain::update(const Digest& d, uint64_t size) {
  a_ = xxh64(&d, sizeof d, a_) ^ rotl(a_, 17);
  b_ = xxh64(&d, sizeof d, b_ + n_);
  n_ += size;
}

std::string DigestChain::hex() const { return hex64(a_ ^ n_, b_); }

}  // namespace ucpkit::pec
