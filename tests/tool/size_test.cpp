// tool::parse_size: the one size syntax of every tool's size options (docs/commands.md, Sizes).
#include <gtest/gtest.h>

#include <cstdint>

#include "support/errors.h"
#include "tool/size.h"

using ucpkit::testing::error_of;
using ucpkit::tool::parse_size;
using ucpkit::tool::size_text;

TEST(Size, PlainBytesAndBinaryMultiples) {
  EXPECT_EQ(parse_size("0", "--x"), 0u);
  EXPECT_EQ(parse_size("1048576", "--x"), 1048576u);
  EXPECT_EQ(parse_size("64K", "--x"), 64u * 1024);
  EXPECT_EQ(parse_size("256M", "--x"), 256u * 1024 * 1024);
  EXPECT_EQ(parse_size("5G", "--x"), 5ull * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_size("2T", "--x"), 2ull * 1024 * 1024 * 1024 * 1024);
  // case, the IEC spelling and a trailing B mean the same multiple
  EXPECT_EQ(parse_size("256m", "--x"), 256u << 20);
  EXPECT_EQ(parse_size("256MiB", "--x"), 256u << 20);
  EXPECT_EQ(parse_size("64kib", "--x"), 64u << 10);
  EXPECT_EQ(parse_size("100B", "--x"), 100u);
  // a fraction is fine when the bytes are whole
  EXPECT_EQ(parse_size("1.5G", "--x"), 3ull << 29);
  EXPECT_EQ(parse_size("0.5K", "--x"), 512u);
}

TEST(Size, RefusalsNameTheOptionAndTheText) {
  for (const char* bad : {"", "M", "-5M", "5X", "5MB", "5GB", "5 M", "1.5", "0.1K", "1.", "5MiBs", "abc"}) {
    const std::string e = error_of([&] { parse_size(bad, "--memory"); }, "accepted");
    EXPECT_NE(e, "accepted") << bad;
    EXPECT_NE(e.find("--memory"), std::string::npos) << e;
    EXPECT_NE(e.find("256M"), std::string::npos) << "the message shows the syntax: " << e;
  }
  EXPECT_NE(error_of([] { parse_size("5MB", "--x"); }).find("ambiguous"), std::string::npos);
  // 2^63 is the largest; past it is refused instead of wrapping around
  EXPECT_EQ(parse_size("8388608T", "--x"), uint64_t{1} << 63);
  EXPECT_NE(error_of([] { parse_size("8388609T", "--x"); }, "accepted"), "accepted");
  EXPECT_NE(error_of([] { parse_size("99999999999999999999", "--x"); }, "accepted"), "accepted");
  EXPECT_NE(error_of([] { parse_size("9223372036854775809", "--x"); }, "accepted"), "accepted");
}

TEST(Size, TextReadsBack) {
  EXPECT_EQ(size_text(256u << 20), "256M");
  EXPECT_EQ(size_text(5ull << 30), "5G");
  EXPECT_EQ(size_text(1536), "1536");
  EXPECT_EQ(size_text(5000000000ull), "5000000000");
  EXPECT_EQ(size_text(0), "0");
  for (uint64_t v : {uint64_t{1}, uint64_t{1023}, uint64_t{1024}, uint64_t{3} << 29, uint64_t{7} << 40, uint64_t{123456789}})
    EXPECT_EQ(parse_size(size_text(v), "--x"), v) << v;
}
