// tool::parse_size: the one size syntax of every tool's size options (docs/commands.md, Sizes).
#include <gtest/gtest.h>

#include <cstdint>

#include "core/error.h"
#include "tool/size.h"

namespace size_test {

using ucpkit::tool::parse_size;
using ucpkit::tool::size_text;

namespace {
// The usage error parse_size throws for `text` (exit 2 in the tools), or "accepted".
std::string refusal(const std::string& text, const std::string& option = "--x") {
  try {
    parse_size(text, option);
  } catch (const ucpkit::UsageError& e) {
    return e.what();
  }
  return "accepted";
}
}  // namespace

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
    const std::string e = refusal(bad, "--memory");
    EXPECT_NE(e, "accepted") << bad;
    EXPECT_NE(e.find("--memory"), std::string::npos) << e;
    EXPECT_NE(e.find("256M"), std::string::npos) << "the message shows the syntax: " << e;
  }
  EXPECT_NE(refusal("5MB").find("ambiguous"), std::string::npos);
  // 2^63 is the largest; past it is refused instead of wrapping around
  EXPECT_EQ(parse_size("8388608T", "--x"), uint64_t{1} << 63);
  EXPECT_NE(refusal("8388609T"), "accepted");
  EXPECT_NE(refusal("99999999999999999999"), "accepted");
  EXPECT_NE(refusal("9223372036854775809"), "accepted");
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

}  // namespace size_test
