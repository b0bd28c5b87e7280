// Shards that must agree: the checks that the files of one checkpoint belong together and that each
// optimizer shard describes its flat partitions completely, made while planning from the pickles
// alone (no pass over tensor data). Without them a valid torch file with the wrong content (a shard
// of another step, a rank with its optimizer state dropped, fragments that overlap) converts with
// exit 0 into a wrong universal checkpoint.
#pragma once
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "io/pickle/value.h"
#include "to_universal/shard_reader.h"

namespace ucpkit::to_universal {

class ShardAgreement {
 public:
  // A model-states file: its identity fields (formats/deepspeed/save_identity.h) are recorded.
  void model_file(const pickle::ValuePtr& root, const std::string& path);
  // An optimizer shard. Checked at once (throws Error naming `path`): per param group, the
  // param_slice_mappings fragments tile the flat partition from 0 without overlap or hole, up to its
  // end or the recorded group padding; the optimizer state is keyed by the shard's param groups; every
  // state tensor is as long as the partition (with or without the padding). Recorded for finish():
  // its identity fields, per param group the optimizer state names and hyper-parameters, the step.
  void optim_shard(const ShardView& shard, const pickle::ValuePtr& root, const std::string& path);
  // ZeRO-1/2 and BF16_Optimizer: the fragments of one flat buffer's partition `part` (of `count`;
  // `buffer` names the buffer: model-parallel rank, param group, EP rank). Checked in finish(): walked
  // in partition order, the buffer's parameters each appear in one run of consecutive partitions, and
  // a parameter cut at a partition boundary ends the earlier partition and starts the later one at 0.
  // Nothing in a shard names its DP rank; this is what catches two rank files exchanged (when a
  // parameter crosses their boundary).
  void partition(const std::string& buffer, int part, int count, int64_t partition_numel,
                 std::vector<std::tuple<std::string, int64_t, int64_t>> fragments, const std::string& path);
  // Every recorded field must have one value in every file that has it. Throws Error naming the first
  // file that differs from the value most files have (and a file with that value).
  void finish() const;

 private:
  struct Seen {
    std::string value, path;
  };
  void note(const std::string& field, std::string value, const std::string& path);
  struct Part {
    std::string path;
    int64_t numel = 0;
    std::vector<std::tuple<std::string, int64_t, int64_t>> fragments;  // sorted by start
  };
  void check_walk(const std::string& buffer, const std::vector<Part>& parts) const;
  std::map<std::string, std::vector<Part>> buffers_;
  std::vector<std::string> order_;                  // fields in the order first seen
  std::map<std::string, std::vector<Seen>> fields_;
};

}  // namespace ucpkit::to_universal
