// How DeepSpeed pads a parameter group's flat buffer and cuts it into per-rank partitions: the one
// place that spells it, for readers (PEC's expert runs) and writers (ucp-load's plan). Pure
// arithmetic, no I/O; worked examples from DeepSpeed's source in
// tests/formats/deepspeed/zero_partition_test.cpp.
//
// ZeRO-1/2 (stage_1_and_2.py, DeepSpeed v0.16.5): the group's parameters lie back to back in one flat
// buffer, padded to a multiple of nccl_start_alignment_factor (2) * dp (:347, :354-357;
// runtime/utils.py:940-952 align_dense_tensors), then cut into dp equal partitions
// (get_data_parallel_partitions, :1603-1621); a partition's padding is its part past the parameters
// (:380-390, the optimizer shard's group_paddings).
// ZeRO-3 (partition_parameters.py v0.19.5:1645-1651, :1771-1772): every parameter is padded on its own
// to a multiple of the partition count and split into ceil(numel / count) slices; a rank's partition
// of a sub-group is its slices back to back. Sub-groups are cut as stage3.py:1129-1152
// _create_fp16_sub_groups does.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace ucpkit::formats::deepspeed {

// stage_1_and_2.py v0.16.5:347: 4-byte alignment / sizeof(fp16).
inline constexpr int64_t kNcclStartAlignmentFactor = 2;

// One group's flat buffer split over `count` ranks (DP ranks, or an expert-DP group's ranks).
struct FlatPartitioning {
  int64_t numel = 0;      // elements of the parameters
  int64_t padded = 0;     // elements with the padding (= partition * count)
  int64_t partition = 0;  // elements of one rank's partition
  int count = 1;          // partitions
  bool per_param = false; // ZeRO-3: every parameter split on its own
};

// ZeRO-1/2: `numel` elements padded to a multiple of 2 * count (an empty buffer stays empty,
// align_dense_tensors adds nothing to 0 elements) and split equally.
FlatPartitioning zero12_partitioning(int64_t numel, int count);

// ZeRO-3: one parameter's slice on every rank, ceil(numel / count) (its padding at the end).
int64_t zero3_slice_numel(int64_t numel, int count);
// ZeRO-3: a sub-group of parameters of `numels` elements; partition = the sum of their slices.
FlatPartitioning zero3_partitioning(std::span<const int64_t> numels, int count);

// ZeRO-3 sub-groups of a parameter group, as [begin, end) index ranges into `numels`: parameters are
// appended in order until the sum of their slices (ceil(numel / count)) reaches `sub_group_size`; the
// last one closes at the group's end. One sub-group when the group's slices fit in sub_group_size.
std::vector<std::pair<size_t, size_t>> zero3_sub_groups(std::span<const int64_t> numels, int count,
                                                        int64_t sub_group_size);

// A run of one parameter inside one rank's partition (param_slice_mappings' fragment_address).
struct PartitionRun {
  size_t param = 0;          // index into the group's parameters
  int64_t start = 0;         // offset in the partition
  int64_t numel = 0;
  int64_t param_offset = 0;  // offset in the flattened parameter
};
struct PartitionContents {
  int64_t padding = 0;  // padding elements inside this partition
  std::vector<PartitionRun> runs;
};

// The parameter runs of partition `part` of a group whose parameters (in flat-buffer order) have
// `numels` elements: ZeRO-1/2 the elements [part * partition, (part + 1) * partition) of the buffer,
// ZeRO-3 (`p.per_param`) the part-th slice of every parameter.
PartitionContents partition_runs(const FlatPartitioning& p, std::span<const int64_t> numels, int part);

// ZeRO-1/2: element `start` of partition `part` as an element of the group's flat buffer.
inline int64_t zero12_flat_offset(int64_t partition, int part, int64_t start) { return part * partition + start; }

}  // namespace ucpkit::formats::deepspeed
