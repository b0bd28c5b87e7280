// tool::typed_name: a usage error names an option as the command line spelled it.
#include <gtest/gtest.h>

#include "tool/typed_name.h"

namespace typed_name_test {

using ucpkit::tool::typed_name;

TEST(TypedName, TheSpellingGivenElseTheFirstName) {
  const std::vector<std::string> names = {"--budget", "--budget-bytes"};
  EXPECT_EQ(typed_name({"--policy", "budget"}, names), "--budget");
  EXPECT_EQ(typed_name({"--budget-bytes", "32K"}, names), "--budget-bytes");
  EXPECT_EQ(typed_name({"--budget", "32K"}, names), "--budget");
  EXPECT_EQ(typed_name({"--budget-bytes=32K"}, names), "--budget-bytes");
  // the last spelling given wins (CLI11 refuses both before a check runs; this only has to be defined)
  EXPECT_EQ(typed_name({"--budget", "1", "--budget-bytes", "2"}, names), "--budget-bytes");
}

TEST(TypedName, APrefixOrAValueAfterDoubleDashIsNotTheOption) {
  const std::vector<std::string> names = {"--chunk", "--chunk-mib"};
  EXPECT_EQ(typed_name({"--chunkx", "1"}, names), "--chunk");          // another option
  EXPECT_EQ(typed_name({"--", "--chunk-mib"}, names), "--chunk");      // a positional argument
  EXPECT_EQ(typed_name({"--chunk-mib", "1", "--"}, names), "--chunk-mib");
}

}  // namespace typed_name_test
