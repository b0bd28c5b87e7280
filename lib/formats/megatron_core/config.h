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

// Whether Megatron-Core release `version` ("0.16", "0.16.1", "0.19.0rc1") keeps the common state in
// common.pt beside the DCP files (before 0.17), rather than as the common_state item inside them (from
// 0.17: "common strategy simplification", Megatron-LM 2beb593b46, first in core_v0.17.0; 0.17+ still
// reads a common.pt, dist_checkpointing/serialization.py:149 at core_v0.19.0). UsageError naming
// --megatron-version for anything but <major>.<minor>[.<patch>...].
bool writes_legacy_common(const std::string& version);

}  // namespace ucpkit::formats::megatron_core
