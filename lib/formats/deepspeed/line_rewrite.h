// A native-MoE checkpoint folder rewritten in place as another DeepSpeed version line lays it out
// (version_line.h): the DeepSpeed file-layout side of pec-restore's --ds-version.
#pragma once
#include <string>

#include "formats/deepspeed/version_line.h"

namespace ucpkit::formats::deepspeed {

// Rewrites the native-MoE checkpoint folder `step_dir` (global_stepN, TP = PP = 1, ZeRO-1/2) in
// place as `line` lays it out: mp_rank_00_model_states.pt (keys, _metadata, views into per-group
// flat buffers or compact copies, param_shapes from the module and expert files by Megatron's
// parameter-group rule) and the expp_rank_* files. The ZeRO shards and expert files are the same in
// every line and are not touched. Returns the line the folder had. Throws Error naming a file.
std::string rewrite_as_line(const std::string& step_dir, const VersionLine& line);

}  // namespace ucpkit::formats::deepspeed
