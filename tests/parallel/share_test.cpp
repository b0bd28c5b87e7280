// parallel/share: the split of work over ranks (largest first onto the least-loaded rank) and each
// rank's share in working order, against a hand-worked example and a re-computation in the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "parallel/share.h"
#include "parallel/threads.h"

namespace share_test {

using namespace ucpkit::parallel;

TEST(Share, LargestFirstOntoLeastLoaded) {
  auto owner = assign_by_size({10, 1, 7, 3, 3}, 2);
  // 10 -> 0, 7 -> 1, 3 -> 1 (7 < 10), 3 -> 0 (10 = 10, lowest rank), 1 -> 1.
  EXPECT_EQ(owner, (std::vector<int>{0, 1, 1, 1, 0}));
  EXPECT_EQ(assign_by_size({5, 5}, 1), (std::vector<int>{0, 0}));
  EXPECT_EQ(assign_by_size({}, 3), (std::vector<int>{}));
  // Ranks <= 0 behave as one rank (a tool that never started MPI).
  EXPECT_EQ(assign_by_size({4, 2}, 0), (std::vector<int>{0, 0}));
}

TEST(Share, SharesPartitionTheItemsLargestFirstAndStayWithinTheLptBound) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 + static_cast<int>(rng() % 7);
    std::vector<uint64_t> sizes(rng() % 40);
    for (auto& s : sizes) s = rng() % 5 == 0 ? 0 : rng() % 1000;
    const auto owner = assign_by_size(sizes, ranks);
    std::vector<int> seen(sizes.size(), 0);
    std::vector<uint64_t> load(ranks, 0);
    for (int r = 0; r < ranks; ++r) {
      const auto mine = share_of(sizes, ranks, r);
      for (size_t k = 0; k < mine.size(); ++k) {
        ASSERT_EQ(owner[mine[k]], r);
        ++seen[mine[k]];
        load[r] += sizes[mine[k]];
        if (k > 0) {
          // Largest first; equal sizes in input order.
          ASSERT_TRUE(sizes[mine[k - 1]] > sizes[mine[k]] ||
                      (sizes[mine[k - 1]] == sizes[mine[k]] && mine[k - 1] < mine[k]));
        }
      }
    }
    for (int c : seen) ASSERT_EQ(c, 1) << "an item in no share or in two";
    // Greedy largest-first bound (Graham): max load <= total / ranks + largest item.
    const uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
    const uint64_t largest = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
    EXPECT_LE(*std::max_element(load.begin(), load.end()) * ranks, total + largest * ranks);
  }
}

TEST(Threads, RequestedCountOrEveryCore) {
  EXPECT_EQ(thread_count(3), 3);
  EXPECT_GE(thread_count(0), 1);
  EXPECT_EQ(thread_count(-1), thread_count(0));
  int seen = 0;
  in_arena(2, [&] { seen = tbb::this_task_arena::max_concurrency(); });
  EXPECT_EQ(seen, 2);
}

}  // namespace share_test
