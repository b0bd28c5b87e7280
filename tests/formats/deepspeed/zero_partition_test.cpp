// formats/deepspeed/zero_partition: worked examples of DeepSpeed's own arithmetic, each computed by
// hand from the source it cites (DeepSpeed v0.16.5 runtime/zero/stage_1_and_2.py and
// runtime/utils.py for ZeRO-1/2, v0.19.5 runtime/zero/partition_parameters.py and stage3.py for ZeRO-3).
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "support/errors.h"
#include "formats/deepspeed/zero_partition.h"

namespace deepspeed_zero_partition_test {

using ucpkit::testing::error_of;
using namespace ucpkit::formats::deepspeed;

TEST(ZeroPartition, Zero12PadsToTwiceDpAndSplitsEqually) {
  // stage_1_and_2.py:354-357 aligns to nccl_start_alignment_factor (2, :347) * dp; utils.py:940-952
  // align_dense_tensors: 10 % 16 = 10, so 6 zeros are added; :1603-1621 splits 16 into 8 of 2.
  auto p = zero12_partitioning(10, 8);
  EXPECT_EQ(p.numel, 10);
  EXPECT_EQ(p.padded, 16);
  EXPECT_EQ(p.partition, 2);
  EXPECT_EQ(p.count, 8);
  EXPECT_FALSE(p.per_param);
  // 40 elements over 3 ranks: alignment 6, 40 % 6 = 4, 2 zeros: 42, partitions of 14.
  p = zero12_partitioning(40, 3);
  EXPECT_EQ(p.padded, 42);
  EXPECT_EQ(p.partition, 14);
  // Already aligned: no padding (remaining == 0); empty: nothing to align.
  EXPECT_EQ(zero12_partitioning(12, 3).padded, 12);
  EXPECT_EQ(zero12_partitioning(0, 4).padded, 0);
  EXPECT_NE(error_of([] { zero12_partitioning(4, 0); }), "");
}

TEST(ZeroPartition, Zero12PartitionRunsAndPaddingAsGroupPaddings) {
  // Parameters of 7 and 3 elements over 8 ranks (padded 16, partitions of 2).
  const std::vector<int64_t> numels{7, 3};
  const auto p = zero12_partitioning(10, 8);
  // Rank 3 holds flat elements [6, 8): get_partition_info (:1623-1650) puts both parameters in its
  // partition, the first one from first_offset = 6.
  auto c = partition_runs(p, numels, 3);
  ASSERT_EQ(c.runs.size(), 2u);
  EXPECT_EQ(c.runs[0].param, 0u);
  EXPECT_EQ(c.runs[0].start, 0);
  EXPECT_EQ(c.runs[0].numel, 1);
  EXPECT_EQ(c.runs[0].param_offset, 6);
  EXPECT_EQ(c.runs[1].param, 1u);
  EXPECT_EQ(c.runs[1].start, 1);
  EXPECT_EQ(c.runs[1].numel, 1);
  EXPECT_EQ(c.runs[1].param_offset, 0);
  EXPECT_EQ(c.padding, 0);
  // :380-390: rank 4 (left_boundary 8, 10 < 8 + 2): padding 8 + 2 - 10 = 0; rank 5 (10 <= 10): its
  // whole partition, 2; the last rank likewise, with no parameter in it.
  EXPECT_EQ(partition_runs(p, numels, 4).padding, 0);
  EXPECT_EQ(partition_runs(p, numels, 5).padding, 2);
  EXPECT_TRUE(partition_runs(p, numels, 7).runs.empty());
  EXPECT_EQ(partition_runs(p, numels, 7).padding, 2);
  // 40 over 3: rank 2 has left_boundary 28, 40 < 28 + 14, padding 28 + 14 - 40 = 2.
  EXPECT_EQ(partition_runs(zero12_partitioning(40, 3), std::vector<int64_t>{24, 16}, 2).padding, 2);
  // Element 1 of rank 2's partition is element 2 * 14 + 1 of the flat buffer.
  EXPECT_EQ(zero12_flat_offset(14, 2, 1), 29);
}

TEST(ZeroPartition, Zero3CeilSlicesPerParameter) {
  // partition_parameters.py:1645-1651 pads every parameter to a multiple of the world size
  // (_padding_size = ws - numel % ws), :1771-1772 partition_size = aligned // ws.
  EXPECT_EQ(zero3_slice_numel(24, 3), 8);   // 24 % 3 = 0
  EXPECT_EQ(zero3_slice_numel(16, 3), 6);   // 16 + 2 = 18, / 3
  EXPECT_EQ(zero3_slice_numel(3, 16), 1);   // 3 + 13 = 16, / 16
  const std::vector<int64_t> numels{24, 16};
  const auto p = zero3_partitioning(numels, 3);
  EXPECT_TRUE(p.per_param);
  EXPECT_EQ(p.numel, 40);
  EXPECT_EQ(p.partition, 14);
  EXPECT_EQ(p.padded, 42);
  // Rank 2: the first parameter's elements [16, 24), then the second's [12, 16) and its 2 zeros.
  const auto c = partition_runs(p, numels, 2);
  ASSERT_EQ(c.runs.size(), 2u);
  EXPECT_EQ(c.runs[0].start, 0);
  EXPECT_EQ(c.runs[0].numel, 8);
  EXPECT_EQ(c.runs[0].param_offset, 16);
  EXPECT_EQ(c.runs[1].start, 8);
  EXPECT_EQ(c.runs[1].numel, 4);
  EXPECT_EQ(c.runs[1].param_offset, 12);
  EXPECT_EQ(c.padding, 2);
  // More ranks than elements: ranks past the elements hold one padding element and no run.
  const std::vector<int64_t> small{3};
  const auto q = zero3_partitioning(small, 16);
  EXPECT_EQ(partition_runs(q, small, 2).runs.size(), 1u);
  EXPECT_TRUE(partition_runs(q, small, 3).runs.empty());
  EXPECT_EQ(partition_runs(q, small, 3).padding, 1);
}

TEST(ZeroPartition, Zero3SubGroupsCutAsCreateFp16SubGroups) {
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  // stage3.py v0.19.5:1129-1152: partition numels (over 4 ranks) 6, 4 and 1.
  const std::vector<int64_t> numels{24, 16, 4};
  // sub_group_size 5: 6 >= 5 closes the first, 4 + 1 = 5 >= 5 closes the second.
  EXPECT_EQ(zero3_sub_groups(numels, 4, 5), (Ranges{{0, 1}, {1, 3}}));
  // 7: 6 < 7, 6 + 4 >= 7 closes [0, 2); the last parameter closes its own.
  EXPECT_EQ(zero3_sub_groups(numels, 4, 7), (Ranges{{0, 2}, {2, 3}}));
  // :1134: sub_group_size >= the group's 11 elements: one sub-group.
  EXPECT_EQ(zero3_sub_groups(numels, 4, 11), (Ranges{{0, 3}}));
  EXPECT_EQ(zero3_sub_groups(numels, 4, 1000000000), (Ranges{{0, 3}}));
  EXPECT_TRUE(zero3_sub_groups(std::vector<int64_t>{}, 4, 5).empty());
}

}  // namespace deepspeed_zero_partition_test
