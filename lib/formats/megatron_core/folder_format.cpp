// Megatron-Core torch_dist folders as formats::detect knows them: an iteration folder (metadata.json
// naming the torch_dist backend) or a save root whose latest_checkpointed_iteration.txt names one.
#include <filesystem>

#include "core/error.h"
#include "formats/dcp/folder.h"
#include "formats/detect.h"
#include "formats/megatron_core/config.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::megatron_core {
namespace {

std::optional<std::string> recognise(const std::string& input) {
  std::error_code ec;
  const fs::path dir(input);
  std::string it = input;
  if (!fs::exists(dir / kConfigFile, ec)) {
    if (!fs::exists(dir / kTrackerFile, ec)) return std::nullopt;
    try {
      it = iteration_dir(input);
    } catch (const Error&) {
      return std::nullopt;  // a tracker of another format (Megatron-LM's torch checkpoints have one too)
    }
  }
  if (dcp::find_folder(it).kind != dcp::FolderKind::TorchDist) return std::nullopt;
  return std::string();
}

[[maybe_unused]] const bool kMegatronCoreFolderFormatRegistered = register_folder_format(
    {std::string(kTorchDist), 40, std::string(kConfigFile) + " (Megatron-Core torch_dist)", recognise,
     entry_names({kConfigFile, "common.pt", kTrackerFile}, {"iter_"})});

}  // namespace
}  // namespace ucpkit::formats::megatron_core
