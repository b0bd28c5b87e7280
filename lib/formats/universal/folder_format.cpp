// ucpkit's own folders as formats::detect knows them: a universal checkpoint (manifest.json) and a
// ucp-extract work folder (plan.json). Asked first: their markers are ucpkit's own names.
#include <filesystem>

#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/detect.h"
#include "formats/universal/manifest.h"

namespace fs = std::filesystem;

namespace ucpkit::formats {
namespace {

std::optional<std::string> holding(const std::string& dir, const char* name) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / name, ec) ? std::optional<std::string>("") : std::nullopt;
}

[[maybe_unused]] const bool kUniversalRegistered = register_folder_format(
    {std::string(kUniversal), 10, std::string(universal::kUniversalManifestName) + " (universal)",
     [](const std::string& dir) { return holding(dir, universal::kUniversalManifestName); },
     entry_names({universal::kUniversalManifestName})});

[[maybe_unused]] const bool kWorkFolderRegistered = register_folder_format(
    {std::string(kWorkFolder), 30, std::string(deepspeed::kWorkPlanName) + " (ucp-extract work folder)",
     [](const std::string& dir) { return holding(dir, deepspeed::kWorkPlanName); }, entry_names({deepspeed::kWorkPlanName})});

}  // namespace
}  // namespace ucpkit::formats
