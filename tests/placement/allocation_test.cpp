// Lazarus allocation formula.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "placement/allocation.h"

namespace allocation_test {

using namespace ucpkit;
using namespace ucpkit::placement;

TEST(Allocation, FollowsTheFormulaOnTheEplbExample) {
  // Layer 0 of the EPLB example, 16 slots: computed by hand from r_e = max(f, floor(t_e/S_e * R_e)).
  std::vector<double> t = {90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86};
  std::vector<int> r = lazarus_allocation(t, 2, 8, 1);
  std::vector<int> expect = {1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 4, 1};
  EXPECT_EQ(r, expect);
}

TEST(Allocation, SumsToSlotsAndRespectsF) {
  std::vector<double> t = {1, 1000, 5, 0, 30, 7};
  for (int f = 1; f <= 3; ++f) {
    std::vector<int> r = lazarus_allocation(t, 4, 5, f);
    EXPECT_EQ(std::accumulate(r.begin(), r.end(), 0), 20);
    for (int x : r) EXPECT_GE(x, f);
    EXPECT_GT(r[1], r[4]);
  }
}

TEST(Allocation, ZeroLoadsSplitEvenly) {
  std::vector<int> r = lazarus_allocation({0, 0, 0, 0}, 2, 4, 1);
  EXPECT_EQ(r, (std::vector<int>{2, 2, 2, 2}));
}

TEST(Allocation, ImpossibleRequestsAreUsageErrors) {
  EXPECT_THROW(lazarus_allocation({1, 2, 3}, 2, 1, 1), UsageError);     // 3 experts, 2 slots
  EXPECT_THROW(lazarus_allocation({1, 2, 3}, 2, 2, 2), UsageError);     // 6 > 4 slots
  EXPECT_THROW(lazarus_allocation({1, 2}, 2, 8, 3), UsageError);        // f > nodes
  EXPECT_THROW(lazarus_allocation({1, 2}, 2, 8, 0), UsageError);
}

}  // namespace allocation_test
