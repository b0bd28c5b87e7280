// A PEC store as formats::detect knows it: its marker file (pec_store.h).
#include "formats/pec_store.h"

#include <filesystem>

#include "formats/detect.h"

namespace fs = std::filesystem;

namespace ucpkit::formats {
namespace {

[[maybe_unused]] const bool kPecStoreRegistered = register_folder_format(
    {std::string(kPecStore), 20, std::string(kPecStoreMarker) + " (PEC store)",
     [](const std::string& dir) -> std::optional<std::string> {
       std::error_code ec;
       if (!fs::exists(fs::path(dir) / kPecStoreMarker, ec)) return std::nullopt;
       return std::string();
     },
     nullptr});

}  // namespace
}  // namespace ucpkit::formats
