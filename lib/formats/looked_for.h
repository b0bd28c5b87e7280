// What the readers look for in a folder, for the one message every tool gives when a folder is none
// of the checkpoints they read (instead of what the last reader tried missed).
#pragma once
#include <string>

namespace ucpkit::formats {

// "<path>: not a checkpoint ucpkit reads: no manifest.json (universal), ..., latest or *_model_states.pt /
// *_optim_states.pt (deepspeed) [in <where>]": what each registered format looks for (detect.h).
std::string not_a_checkpoint(const std::string& path, const std::string& where = "");

// Whether a registered format owns the top-level name (detect.h FolderFormat::owns_entry).
bool registered_entry(const std::string& name);

// True for a name a checkpoint folder (or an output folder of these tools) holds at its top: the
// universal manifest, a work folder's plan, DeepSpeed's latest / global_step* / shards, DCP's
// .metadata and data files, torch_dist's metadata.json / iter_*, safetensors. Registered with
// core/staging as what `--overwrite` may replace.
bool is_checkpoint_entry(const std::string& name);

}  // namespace ucpkit::formats
