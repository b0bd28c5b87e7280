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

// Incremental form over a sequence of buffers (equivalent to digest of their concatenation is NOT
// guaranteed; used only for whole-file checksums computed the same way on save and restore).
class DigestChain {
 public:
  void update(std::span<const uint8_t> bytes);
  std::string hex() const;

 private:
  uint64_t a_ = 0x9E3779B97F4A7C15ull, b_ = 0xC2B2AE3D27D4EB4Full;
  uint64_t n_ = 0;
};

}  // namespace ucpkit::pec
