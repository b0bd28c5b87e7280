// The common (non-sharded) state of a Megatron-Core torch_dist checkpoint: everything of the saved
// state dict that is not a ShardedTensor / ShardedObject (args, iteration, checkpoint_version,
// content_metadata, the optimizer's param_groups and scheduler, ...). Megatron-Core <= 0.16 writes it
// to a separate `common.pt` (torch.save of the dict); later versions store it as the ShardedObject
// `common_state` inside the DCP checkpoint (a bytes item holding torch.save([dict])).
// Sources: docs/formats-megatron-core.md.
#pragma once
#include <optional>
#include <string>

#include "io/pickle/value.h"

namespace ucpkit::formats::dcp {
class Reader;
}

namespace ucpkit::formats::megatron_core {

// The DCP fqn of the common_state ShardedObject (ShardedObject.unique_key: key/shard_<offset>_<shape>).
inline constexpr const char* kCommonStateKey = "common_state/shard_0_1";

struct CommonState {
  pickle::ValuePtr root;  // the dict
  bool legacy = false;    // read from common.pt
  std::string source;     // the file it came from (common.pt or the data file of the item)

  // root['iteration'] when an int.
  std::optional<int64_t> iteration() const;
  // root['checkpoint_version'] when a number.
  std::optional<double> checkpoint_version() const;
  // root['content_metadata'][key] when a string (e.g. "distrib_optim_sharding_type").
  std::optional<std::string> content_string(std::string_view key) const;
  // root['args'].<name> (an argparse.Namespace field), or nullptr.
  pickle::ValuePtr arg(std::string_view name) const;
};

// Reads the common state of the iteration folder `dir`: common.pt when present (as Megatron's
// load_common_state_dict does first), else the common_state item. Throws Error naming the file when
// neither is there or the value is not a dict.
CommonState read_common_state(const std::string& dir, const dcp::Reader& reader);

}  // namespace ucpkit::formats::megatron_core
