// Content checksums of the PEC store: 128 bits from two seeded XXH64 passes, written as 32 hex digits.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace ucpkit::pec {

uint64_t xxh64(const void* data, size_t n, uint64_t seed);

struct Digest {
  uint64_t hi = 0, lo = 0;
  std::string hex() const;
  bool operator==(const Digest&) const = default;
};

Digest digest(std::span<const uint8_t> bytes);
Digest digest(std::string_view text);

// XXH64 over bytes given piece by piece (same value as xxh64() of their concatenation).
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed);
  void update(const void* data, size_t n);
  uint64_t value() const;

 private:
  uint64_t v_[4];
  uint64_t seed_, total_ = 0;
  uint8_t buf_[32];
  size_t buffered_ = 0;
};

// digest() of bytes given piece by piece: each byte is hashed once, as it streams past.
class DigestStream {
 public:
  DigestStream();
  void update(std::span<const uint8_t> bytes);
  Digest value() const { return {hi_.value(), lo_.value()}; }

 private:
  Xxh64 hi_, lo_;
};

// Incremental form over a sequence of buffers (equivalent to digest of their concatenation is NOT
// guaranteed; used only for whole-file checksums computed the same way on save and restore).
class DigestChain {
 public:
  void update(std::span<const uint8_t> bytes);
  // The same step from the piece's digest() and size (the piece need not be hashed again).
  void update(const Digest& piece, uint64_t size);
  std::string hex() const;

 private:
  uint64_t a_ = 0x9E3779B97F4A7C15ull, b_ = 0xC2B2AE3D27D4EB4Full;
  uint64_t n_ = 0;
};

}  // namespace ucpkit::pec
