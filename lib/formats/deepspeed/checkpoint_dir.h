// A checkpoint folder around its tag folders: the `latest` / `latest_universal` pointer files (the tag
// DeepSpeed's load_checkpoint takes when none is given, engine.py save_checkpoint writes it after the
// tag folder), `global_step<N>` tags (engine.py's default tag) and what kind of input a folder is. The
// one place that reads and writes them; the tools resolve their inputs and commit their outputs here.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ucpkit::formats::deepspeed {

// Pointer files in a checkpoint folder: DeepSpeed's, and ds_to_universal's for the universal copy.
inline constexpr const char* kLatestName = "latest";
inline constexpr const char* kLatestUniversalName = "latest_universal";
// ucp-extract's work folder holds its plan under this name (to_universal/extract.h).
inline constexpr const char* kWorkPlanName = "plan.json";

// "global_step<N>": DeepSpeed's default tag (engine.py save_checkpoint: tag = f"global_step{self.global_steps}").
std::string step_tag(int64_t step);
// Whether a folder name is a step tag folder or pec-restore's staging of one ("global_step...",
// ".global_step..."), by its prefix only (a damaged N still counts: a report must not land there).
bool looks_like_step_folder(const std::string& name);
// N of a tag "global_step<N>"; nullopt for other names (a custom tag) or an N of more than 18 digits.
std::optional<int64_t> step_of_tag(const std::string& tag);

// The checkpoint tag a folder stands for: its own name however the path is spelled (".", "..", a
// trailing slash, a relative path, a symbolic link to the tag folder: the link's target's name).
std::string tag_of_dir(const std::string& dir);

// The tag a pointer file names (surrounding white space dropped). Throws Error naming the file when it
// cannot be read, is empty or names a path rather than a tag.
std::string read_pointer(const std::string& pointer_file);

// A tag folder and how it was found.
struct TagFolder {
  std::string dir;      // the tag folder (`path` or `path`/<tag>, spelled from `path`)
  std::string tag;      // its tag
  std::string pointer;  // the pointer file that named it; "" when `path` was the tag folder itself
};
// `path` is a tag folder, or a checkpoint folder whose first pointer file of `pointers` (that exists as
// a file) names one. Throws Error naming the path or the pointer file when there is no such folder.
TagFolder resolve_tag_folder(const std::string& path, const std::vector<std::string>& pointers = {kLatestName});

// Whether the folder `dir` holds DeepSpeed model or optimizer shards (`*_model_states.pt`, `*_optim_states.pt`).
bool holds_shards(const std::string& dir);

// resolve_tag_folder(path).dir: the global_stepN folder of a checkpoint path.
std::string resolve_checkpoint_dir(const std::string& path);

// The step `dir`'s `latest` names when its tag folder exists; nullopt while there is none, or while
// `latest` is being replaced (pec-save --watch polls it).
std::optional<int64_t> completed_step(const std::string& dir);

// Writes `latest` (and with `universal` `latest_universal`) naming `tag` into the checkpoint folder
// `dir`, each atomically (after the tag folder is in place, as DeepSpeed does); `durable`: fsynced.
void write_latest(const std::string& dir, const std::string& tag, bool universal = false, bool durable = false);

}  // namespace ucpkit::formats::deepspeed
