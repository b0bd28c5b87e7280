// core/json_input: the depth bound, one-line errors that name the input, and the brief renderings.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/json_input.h"
#include "support/errors.h"

namespace json_input_test {

using namespace ucpkit;

namespace {

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string error_of(const std::string& text) {
  return ucpkit::testing::error_of([&] { parse_json_input(text, "in.json"); });
}

}  // namespace

TEST(JsonInput, DepthUpToTheLimitParsesOneMoreIsRefused) {
  EXPECT_NO_THROW(parse_json_input(nested(kMaxJsonDepth), "in.json"));
  std::string msg = error_of(nested(kMaxJsonDepth + 1));
  EXPECT_NE(msg.find("in.json"), std::string::npos) << msg;
  // 100,000 levels: refused with a short message, not a stack overflow.
  msg = error_of(nested(100000));
  EXPECT_NE(msg.find("in.json"), std::string::npos);
  EXPECT_LT(msg.size(), 300u);
}

TEST(JsonInput, ErrorsAreOneShortLineNamingTheFile) {
  std::string bad = "{\"a\": \n\x01\xff" + std::string(5000, 'x');
  std::string msg = error_of(bad);
  ASSERT_FALSE(msg.empty());
  EXPECT_EQ(msg.rfind("in.json", 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 300u);
  EXPECT_EQ(msg.find(std::string(200, 'x')), std::string::npos) << "input echoed back";
}

TEST(JsonInput, TryParseReturnsFalseOnBadJsonButThrowsOnDepth) {
  nlohmann::json out;
  EXPECT_FALSE(try_parse_json_input("layer,expert\n0,1", "in.csv", out));
  EXPECT_TRUE(try_parse_json_input("[[1,2],[3,4]]", "in.json", out));
  EXPECT_EQ(out[1][0].get<int>(), 3);
  EXPECT_THROW(try_parse_json_input(nested(kMaxJsonDepth + 5), "in.json", out), Error);
}

TEST(JsonInput, EscapedBriefEscapesAndCuts) {
  EXPECT_EQ(escaped_brief("abc"), "abc");
  EXPECT_EQ(escaped_brief(std::string("a\nb\x01\xc3", 5)), "a\\x0ab\\x01\\xc3");
  std::string cut = escaped_brief(std::string(200, 'y'), 10);
  EXPECT_EQ(cut.rfind(std::string(10, 'y'), 0), 0u);
  EXPECT_NE(cut.find("..."), std::string::npos);
  EXPECT_LT(cut.size(), 20u);
}

TEST(JsonInput, JsonBriefNamesContainersBySize) {
  EXPECT_EQ(json_brief(nlohmann::json(42)), "42");
  EXPECT_EQ(json_brief(nlohmann::json::array({1, 2, 3})), "a list of 3");
  EXPECT_EQ(json_brief(nlohmann::json{{"a", 1}, {"b", 2}}), "an object of 2 keys");
  EXPECT_LT(json_brief(nlohmann::json(std::string(1000, 'z'))).size(), 200u);
}

TEST(JsonInput, ScalarsAndKeysAtTheDeepestLevelAreAccepted) {
  // kMaxJsonDepth levels: kMaxJsonDepth - 2 lists, an object, and a list of scalars inside it.
  std::string deepest = std::string(kMaxJsonDepth - 2, '[') + "{\"k\": [1, 2]}" + std::string(kMaxJsonDepth - 2, ']');
  nlohmann::json v = parse_json_input(deepest, "in.json");
  EXPECT_TRUE(v.is_array());
  std::string deeper = std::string(kMaxJsonDepth - 1, '[') + "{\"k\": [1]}" + std::string(kMaxJsonDepth - 1, ']');
  EXPECT_THROW(parse_json_input(deeper, "in.json"), Error);
}

}  // namespace json_input_test
