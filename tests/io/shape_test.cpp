// lib/io/shape: the one numel / shape text helper pair.
#include <gtest/gtest.h>

#include "io/shape.h"

namespace shape_test {

TEST(Shape, NumelIsTheProductOfTheDimensions) {
  EXPECT_EQ(ucpkit::numel_of({}), 1);  // a scalar
  EXPECT_EQ(ucpkit::numel_of({0, 7}), 0);
  EXPECT_EQ(ucpkit::numel_of({2, 3, 4}), 24);
  EXPECT_EQ(ucpkit::numel_of({50304, 4096}), int64_t{206045184});
}

TEST(Shape, TextIsPythonListLike) {
  EXPECT_EQ(ucpkit::shape_str({}), "[]");
  EXPECT_EQ(ucpkit::shape_str({5}), "[5]");
  EXPECT_EQ(ucpkit::shape_str({2, 3}), "[2, 3]");
}

}  // namespace shape_test
