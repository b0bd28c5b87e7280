// Megatron-Core `torch_dist` checkpoint folders: the iteration folder and `metadata.json`
// (megatron/core/dist_checkpointing/core.py: CheckpointingConfig{sharded_backend,
// sharded_backend_version}; docs/formats-megatron-core.md cites the lines).
#pragma once
#include <cstdint>
#include <string>

namespace ucpkit::formats::megatron_core {

inline constexpr const char* kConfigFile = "metadata.json";
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kLegacyCommonFile = "common.pt";

struct CheckpointConfig {
  std::string sharded_backend;          // "torch_dist" is the one ucpkit reads
  int64_t sharded_backend_version = 1;  // dataclass default when absent
};

// `path` itself when it holds metadata.json; else a save root whose tracker file names the
// iteration: iter_{N:07d} (a number) or the named folder (Megatron's "release"). Throws Error
// naming the path otherwise.
std::string iteration_dir(const std::string& path);

// Parses metadata.json text; `name` is the file named in every error. sharded_backend is
// required (Megatron's CheckpointingConfig has no default for it), unknown fields are ignored as
// Megatron ignores them.
CheckpointConfig parse_config(const std::string& text, const std::string& name);
// Reads dir/metadata.json and requires sharded_backend == "torch_dist".
CheckpointConfig read_config(const std::string& dir);

}  // namespace ucpkit::formats::megatron_core
