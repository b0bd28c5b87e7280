// PyTorch DCP folders as formats::detect knows them (folder.h find_folder: `.metadata`, rank-local
// parts, the safetensors flavour). A torch_dist folder is DCP too, but megatron_core registers it,
// asked before this one.
#include "formats/dcp/folder.h"
#include "formats/detect.h"

namespace ucpkit::formats::dcp {
namespace {

[[maybe_unused]] const bool kDcpFolderFormatRegistered = register_folder_format(
    {std::string(kDcp), 50, ".metadata (PyTorch DCP)",
     [](const std::string& dir) -> std::optional<std::string> {
       const FolderKind kind = find_folder(dir).kind;
       if (kind == FolderKind::None || kind == FolderKind::TorchDist) return std::nullopt;
       return std::string(folder_kind_name(kind));
     },
     entry_names({".metadata", "model.safetensors.index.json"}, {"__"}, {".distcp", ".safetensors"})});

}  // namespace
}  // namespace ucpkit::formats::dcp
