// ZeRO flat-buffer padding and partitions (DeepSpeed stage_1_and_2.py, stage3.py, partition_parameters.py).
#include "formats/deepspeed/zero_partition.h"

#include <algorithm>

#include "core/error.h"

namespace ucpkit::formats::deepspeed {

namespace {
void check_count(int count) {
  if (count < 1) throw Error("ZeRO partitioning over " + std::to_string(count) + " ranks");
}
}  // namespace

FlatPartitioning zero12_partitioning(int64_t numel, int count) {
  check_count(count);
  const int64_t align = kNcclStartAlignmentFactor * count;
  FlatPartitioning p;
  p.numel = numel;
  p.count = count;
  p.padded = (numel + align - 1) / align * align;
  p.partition = p.padded / count;
  return p;
}

int64_t zero3_slice_numel(int64_t numel, int count) {
  check_count(count);
  return (numel + count - 1) / count;
}

FlatPartitioning zero3_partitioning(std::span<const int64_t> numels, int count) {
  FlatPartitioning p;
  p.count = count;
  p.per_param = true;
  for (int64_t n : numels) {
    p.numel += n;
    p.partition += zero3_slice_numel(n, count);
  }
  p.padded = p.partition * count;
  return p;
}

std::vector<std::pair<size_t, size_t>> zero3_sub_groups(std::span<const int64_t> numels, int count,
                                                        int64_t sub_group_size) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t local = 0;  // stage3.py:1139 local_sub_group_size
  for (size_t i = 0; i < numels.size(); ++i) {
    local += zero3_slice_numel(numels[i], count);
    if (local >= sub_group_size || i + 1 == numels.size()) {
      out.emplace_back(begin, i + 1);
      begin = i + 1;
      local = 0;
    }
  }
  return out;
}

PartitionContents partition_runs(const FlatPartitioning& p, std::span<const int64_t> numels, int part) {
  PartitionContents c;
  if (p.per_param) {
    int64_t start = 0;
    for (size_t i = 0; i < numels.size(); ++i) {
      const int64_t n = numels[i], per = zero3_slice_numel(n, p.count);
      const int64_t a = std::min(n, part * per), b = std::min(n, (part + 1) * per);
      if (b > a) c.runs.push_back({i, start, b - a, a});
      c.padding += per - (b - a);
      start += per;
    }
    return c;
  }
  const int64_t lo = zero12_flat_offset(p.partition, part, 0), hi = lo + p.partition;
  int64_t offset = 0;  // the parameter's first element in the flat buffer
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t a = std::max(offset, lo), b = std::min(offset + numels[i], hi);
    if (b > a) c.runs.push_back({i, a - lo, b - a, a - offset});
    offset += numels[i];
  }
  // stage_1_and_2.py v0.16.5:384-389: the partition's part past the parameters.
  c.padding = hi - std::max(lo, std::min(hi, p.numel));
  return c;
}

}  // namespace ucpkit::formats::deepspeed
