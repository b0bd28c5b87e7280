// Name templates of the map files (patterns/name_template.h).
#include <gtest/gtest.h>

#include "patterns/name_template.h"

namespace name_template_test {

using namespace ucpkit::patterns;

TEST(NameTemplate, MatchesWholeNamesAndReadsThePlaceholders) {
  std::map<std::string, long> v;
  EXPECT_TRUE(match_name_template("decoder.layers.{L}.mlp.linear_fc1.weight", "decoder.layers.12.mlp.linear_fc1.weight", v));
  EXPECT_EQ(v["{L}"], 12);
  v.clear();
  EXPECT_FALSE(match_name_template("decoder.layers.{L}.mlp.linear_fc1.weight", "decoder.layers.12.mlp.linear_fc1.weight.x", v));
  v.clear();
  EXPECT_FALSE(match_name_template("decoder.layers.{L}.x", "decoder.layers..x", v));  // a placeholder is digits
  v.clear();
  EXPECT_FALSE(match_name_template("a.{L}.b.{L}", "a.1.b.2", v));  // the same placeholder, the same number
  v.clear();
  EXPECT_FALSE(match_name_template("a.{L}", "a.1234567890", v));  // more than 9 digits
  v.clear();
  EXPECT_FALSE(match_name_template("a.{L", "a.1", v));  // an unclosed placeholder matches nothing
  EXPECT_EQ(substitute_placeholder("model.layers.{L}.mlp.{L}", "{L}", 3), "model.layers.3.mlp.3");
}

}  // namespace name_template_test
