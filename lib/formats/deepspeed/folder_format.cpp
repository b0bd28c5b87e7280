// DeepSpeed checkpoints as formats::detect knows them: a tag folder holding model or optimizer shards
// (`*_model_states.pt`, `*_optim_states.pt`), or a checkpoint folder whose `latest` names one (a
// `latest` that names no folder is refused by detect, naming the pointer). Asked last: its markers
// are the least specific.
#include <filesystem>

#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/detect.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::deepspeed {
namespace {

std::optional<std::string> recognise(const std::string& dir) {
  if (holds_shards(dir)) return std::string();
  std::error_code ec;
  const fs::path latest = fs::path(dir) / kLatestName;
  if (!fs::exists(latest, ec) || fs::is_directory(latest, ec)) return std::nullopt;
  // A `latest` that names no tag folder is this format's damaged pointer: refused here, naming it.
  if (holds_shards(resolve_tag_folder(dir).dir)) return std::string();
  return std::nullopt;
}

[[maybe_unused]] const bool kDeepspeedFolderFormatRegistered = register_folder_format(
    {std::string(kDeepSpeed), 90, std::string(kLatestName) + " or *_model_states.pt / *_optim_states.pt (DeepSpeed)",
     recognise, entry_names({kLatestName, kLatestUniversalName}, {"global_step", "mp_rank_", "zero_pp_rank_"}, {".pt"})});

}  // namespace
}  // namespace ucpkit::formats::deepspeed
