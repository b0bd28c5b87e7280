// Shards that must agree: the checks that the files of one checkpoint belong together and that each
// optimizer shard describes its flat partitions completely, made while planning from the pickles
// alone (no pass over tensor data). Without them a valid torch file with the wrong content (a shard
// of another step, a rank with its optimizer state dropped, fragments that overlap) converts with
// exit 0 into a wrong universal checkpoint.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "ucp/shard_reader.h"

namespace ucpkit::ucp {

class ShardAgreement {
 public:
  // A model-states file: its identity fields (layout/deepspeed/save_identity.h) are recorded.
  void model_file(const pickle::ValuePtr& root, const std::string& path);
  // An optimizer shard. Checked at once (throws Error naming `path`): per param group, the
  // param_slice_mappings fragments tile the flat partition from 0 without overlap or hole, up to its
  // end or the recorded group padding; the optimizer state is keyed by the shard's param groups; every
  // state tensor is as long as the partition (with or without the padding). Recorded for finish():
  // its identity fields, per param group the optimizer state names and hyper-parameters, the step.
  void optim_shard(const ShardView& shard, const pickle::ValuePtr& root, const std::string& path);
  // Every recorded field must have one value in every file that has it. Throws Error naming the first
  // file that differs from the value most files have (and a file with that value).
  void finish() const;

 private:
  struct Seen {
    std::string value, path;
  };
  void note(const std::string& field, std::string value, const std::string& path);
  std::vector<std::string> order_;                  // fields in the order first seen
  std::map<std::string, std::vector<Seen>> fields_;
};

}  // namespace ucpkit::ucp
