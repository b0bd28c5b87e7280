// DeepSpeed version lines of the native-MoE save path (Megatron-DeepSpeed GPT-MoE, ZeRO-1/2): what
// `_save_moe_checkpoint` writes in each line (shared/docs/deepspeed-moe-format.md sections 3 and 8).
// The one place that knows them: readers describe what they found (MoeFileFacts) and ask which line
// it is; writers take a line and emit its keys, module form and files. Pure data, no I/O.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

struct VersionLine {
  std::string name;        // option value: "0.14", "0.17.1", "0.19.2", "0.19.3", "0.19.5"
  std::string range;       // DeepSpeed tags it covers, e.g. "v0.14.0 - v0.17.0"
  std::string ds_version;  // written into ds_version when the line has the key (its first release)
  std::string source;      // DeepSpeed file:line of the save code that writes it
  bool module_metadata;    // the module's OrderedDicts keep torch's `_metadata` attribute
  bool compact_copies;     // clone_tensors_for_torch_save: every tensor its own compact CPU storage
                           // (else module tensors are views into the param group's flat lp buffer)
  bool common_state;       // _common_checkpoint_state: param_shapes (all groups), ds_config, ds_version ...
  bool autoep_key;         // 'ds_autoep_layers': None after num_experts
  bool expp_files;         // expp_rank_R_mp_rank_XX_optim_states.pt ({'optimizer': None}) under ZeRO
  // DeepSpeed's own keys of mp_rank_XX_model_states.pt in save order; Megatron's client state
  // (args, checkpoint_version, iteration, tokens, universal_checkpoint_info, rng_state) follows.
  std::vector<std::string> mp_rank_keys;
};

// Key of {pp_degree, tp_degree} in model files from v0.19.5 on (checkpoint/constants.py:46-48,
// runtime/engine.py:238-246).
inline constexpr const char* kCheckpointParallelDims = "checkpoint_parallel_dimensions";

// Whether `key` is one of DeepSpeed's own keys of a model-states file in any line (the newest
// line's list holds every key an older line writes); every other key is the client state
// (Megatron's args, iteration, rng_state, ...), which engine.py appends with state.update(client_state).
bool is_deepspeed_model_key(std::string_view key);

// Every line, oldest first.
const std::vector<VersionLine>& moe_version_lines();
// The line named `name` ("0.16", "0.16.5", "v0.19.4" are accepted too: a release maps to the line
// that contains it); throws UsageError listing the lines when nothing matches.
const VersionLine& moe_version_line(std::string_view name);
// The line containing DeepSpeed release `version` ("0.16.5"), nullopt when it is older than 0.14
// or not a version.
std::optional<std::string> moe_line_of_release(std::string_view version);
// "0.14 (v0.14.0 - v0.17.0), 0.17.1 (...), ..." for messages and --help.
std::string moe_version_line_list();

// What a reader found in a native MoE checkpoint.
struct MoeFileFacts {
  bool param_shapes = false;       // mp_rank file has param_shapes
  bool autoep_key = false;         // mp_rank file has ds_autoep_layers
  bool module_metadata = false;    // some OrderedDict in module carries _metadata
  bool expp_files = false;         // expp_rank_* files present
  bool parallel_dims = false;      // mp_rank file has checkpoint_parallel_dimensions (v0.19.5 on)
  std::string ds_version;          // mp_rank file's ds_version, "" when absent
};
// The facts of one mp_rank model-states dict (`expp_files`: whether the folder has expp_rank_* files).
MoeFileFacts moe_file_facts(const pickle::ValuePtr& model_root, bool expp_files);
// The line those facts belong to (the newest line consistent with them).
const VersionLine& detect_moe_version_line(const MoeFileFacts& facts);

// The line to write: `requested` (--ds-version: a line or a release) when given, else the line the
// universal checkpoint recorded (`recorded`, manifest source.ds_line), else the one the template
// model file shows (`template_root`).
const VersionLine& resolve_moe_line(const std::string& requested, const std::string& recorded,
                                    const pickle::ValuePtr& template_root);

}  // namespace ucpkit::formats::deepspeed
