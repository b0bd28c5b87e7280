// Hugging Face model folders as formats::detect knows them (folder.h is_hf_folder). Asked after DCP, whose
// safetensors flavour (HuggingFaceStorageWriter) also holds .safetensors files but marks them as DCP's.
#include "formats/detect.h"
#include "formats/hf/folder.h"

namespace ucpkit::formats::hf {
namespace {

[[maybe_unused]] const bool kHfFolderFormatRegistered = register_folder_format(
    {std::string(kHf), 60, std::string(kConfigFile) + " with " + kSingleFile + " or " + kIndexFile + " (Hugging Face)",
     [](const std::string& dir) -> std::optional<std::string> {
       if (!is_hf_folder(dir)) return std::nullopt;
       return std::string();
     },
     entry_names({kConfigFile, kIndexFile, "generation_config.json"}, {}, {".safetensors"})});

}  // namespace
}  // namespace ucpkit::formats::hf
