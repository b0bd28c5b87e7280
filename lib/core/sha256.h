// SHA-256 (FIPS 180-4) of byte streams: the digests an audit records (docs/hf.md "Audit"), comparable with
// `sha256sum` and Python's hashlib. Incremental: update() any number of times, then hex().
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ucpkit {

class Sha256 {
 public:
  Sha256();
  void update(std::span<const uint8_t> bytes);
  // The digest as 64 lowercase hex digits; the object is spent afterwards.
  std::string hex();

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t used_ = 0;
  uint64_t length_ = 0;  // bytes
};

std::string sha256_hex(std::span<const uint8_t> bytes);

}  // namespace ucpkit
