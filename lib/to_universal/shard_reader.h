// Reading ZeRO optimizer shards: per-group metadata (fragments, partition count, expert groups,
// optimizer states) and the fragment bytes themselves, from lazily memory-mapped files.
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "io/pickle/value.h"
#include "formats/deepspeed/optimizer_shard.h"
#include "io/torch/torch_file.h"
#include "to_universal/plan.h"

namespace ucpkit::to_universal {

struct GroupInfo {
  bool moe = false;
  int ep_size = 0;
  int partition_count = -1;  // -1: not recorded
};

// A view of one ZeRO-1/2, BF16_Optimizer or ZeRO-3 shard (`*_optim_states.pt` root) for planning
// and reading, through formats::deepspeed::OptimizerShard (read once, when constructed). For ZeRO-3 a
// "group" is a sub-group (fp32_flat_groups[g], optimizer_state_dict.state[g]).
class ShardView {
 public:
  ShardView(pickle::ValuePtr root, std::string path);
  int groups() const { return static_cast<int>(shard_.groups.size()); }
  GroupInfo group_info(int g) const;
  // param_slice_mappings[g] in buffer order: (name, start in partition, numel).
  std::vector<std::tuple<std::string, int64_t, int64_t>> fragments(int g) const;
  // "fp32" then every 1-D tensor state of the group (exp_avg, exp_avg_sq, ... sorted).
  std::vector<std::string> states(int g) const;
  bool has_step(int g) const { return group(g).step != nullptr; }
  // The flat partition of `state` ("fp32" = single_partition_of_fp32_groups[g]).
  Tensor state_tensor(int g, const std::string& state) const;
  pickle::ValuePtr step(int g) const;
  const formats::deepspeed::OptimizerShard& shard() const { return shard_; }
  bool zero3() const { return shard_.zero3(); }
  const std::string& path() const { return path_; }

 private:
  const formats::deepspeed::OptimizerShard::Group& group(int g) const;
  formats::deepspeed::OptimizerShard shard_;
  std::string path_;
};

// Thread-safe cache of loaded source files (pickle trees; tensor bytes stay mapped and lazy).
class SourceCache {
 public:
  // `open`: how each file is opened on first use (its CRC check, torch_file.h).
  explicit SourceCache(std::vector<std::string> files, const TorchLoadOptions& open = {});
  std::shared_ptr<const TorchFile> get(int file);
  // The file as an optimizer shard, read once (the file must be one).
  const ShardView& shard(int file);
  const std::string& path(int file) const { return files_[file]; }
  // Copies the bytes of a contiguous tensor that lives in `file`'s mapping with pread (a plain
  // kernel copy, like `cat`, instead of faulting the mapping in); false when it cannot.
  bool read_into(int file, const Tensor& t, uint8_t* dst);
  ~SourceCache();

 private:
  std::vector<std::string> files_;
  TorchLoadOptions open_;
  std::vector<std::shared_ptr<const TorchFile>> loaded_;
  std::vector<std::unique_ptr<std::once_flag>> once_;
  std::vector<std::unique_ptr<ShardView>> shards_;
  std::vector<std::unique_ptr<std::once_flag>> shard_once_;
  std::vector<int> fds_;
  std::vector<std::unique_ptr<std::once_flag>> fd_once_;
};

// The 1-D run of `state` that a fragment names (a view into the mapped file).
Tensor fragment_tensor(SourceCache& cache, const SourceFragment& f, const std::string& state);
// One TP slice of one state: its fragments concatenated in partition order, shaped `shape`.
// Adds the bytes read to *bytes_read. Mapped pages are released after the copy.
Tensor read_slice(SourceCache& cache, const std::vector<SourceFragment>& fragments, const std::string& state,
                  const std::vector<int64_t>& shape, uint64_t* bytes_read);
// The raw step value (int or tensor) of a group, or of a work-folder fragment file.
pickle::ValuePtr read_step(SourceCache& cache, int file, int group);

// Tells the kernel the bytes of a mapped tensor are no longer needed (bounded resident memory).
void release_pages(const Tensor& t);

}  // namespace ucpkit::to_universal
