// SHA-256 (core/sha256.h) against FIPS 180-4's examples and an incremental feed.
#include <gtest/gtest.h>

#include <string>

#include "core/sha256.h"

namespace sha256_test {

using namespace ucpkit;

namespace {
std::span<const uint8_t> bytes_of(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }
}  // namespace

TEST(Sha256, KnownDigests) {
  EXPECT_EQ(sha256_hex(bytes_of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(bytes_of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(bytes_of(std::string(1000000, 'a'))), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsWhole) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(static_cast<char>(i * 7));
  Sha256 h;
  for (size_t at = 0; at < s.size(); at += 37) h.update(bytes_of(s.substr(at, 37)));
  EXPECT_EQ(h.hex(), sha256_hex(bytes_of(s)));
}

}  // namespace sha256_test
