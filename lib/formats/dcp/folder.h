// Which DCP folder a path is, and its metadata as one Metadata: a reshardable save (`.metadata`), a
// rank-local one (`__{rank}.metadata` files, or torch 2.6's `save_state_dict(no_dist=True)` into
// `rank_<r>/` folders, each with its own `.metadata`: merged here, replicated chunks kept once), or
// Megatron-Core's `torch_dist` (DCP plus `metadata.json` naming the sharded backend).
// docs/formats-dcp.md, "Folders".
#pragma once
#include <string>
#include <vector>

#include "formats/dcp/metadata.h"

namespace ucpkit::formats::dcp {

enum class FolderKind {
  None,       // not a DCP folder
  Global,     // `.metadata` (the reshardable form every torch 2.x and 1.13 write)
  RankLocal,  // no `.metadata`: `__{rank}.metadata` files or `rank_<r>/.metadata` folders
  TorchDist,  // Megatron-Core dist_checkpointing: `metadata.json` with sharded_backend torch_dist
  Safetensors,  // HuggingFaceStorageWriter: `*.safetensors` with DCP_SHARDING_INFO (safetensors_flavour.h)
};
std::string_view folder_kind_name(FolderKind kind);  // "dcp", "dcp-rank-local", "torch_dist", "dcp-safetensors", "none"

struct Folder {
  FolderKind kind = FolderKind::None;
  std::string dir;
  // The metadata files read (one for Global and TorchDist, one per rank for RankLocal, rank order; the
  // .safetensors files for Safetensors).
  std::vector<std::string> metadata_files;
  // Per metadata file, the folder (relative to dir, "" for dir itself) its items' files lie in.
  std::vector<std::string> data_dirs;
  std::string sharded_backend;  // metadata.json's sharded_backend ("" when none)
};

// Looks at the folder's names only (no file is parsed but metadata.json, and the headers of the
// `*.safetensors` files of a folder without `.metadata` or rank-local parts). Kind None when `path` is no
// DCP folder; throws Error naming the file when metadata.json names a sharded backend other than
// torch_dist or is not readable JSON.
Folder find_folder(const std::string& path);

// The folder's metadata as one: a Global / TorchDist folder's `.metadata`; a RankLocal folder's files
// merged (entries must agree on dtype and global size; a chunk box saved by several ranks is a replica,
// kept once, from the lowest rank, as DCP's dedup_save_plans keeps one writer; item paths prefixed with
// their rank folder). Errors name the metadata file.
Metadata read_folder_metadata(const Folder& folder);

// The world size that saved the checkpoint as its files tell it: RankLocal, one per metadata file;
// else the highest `__{rank}_` prefix of a `.distcp` data file in the folder (or named by an item) + 1
// (FileSystemWriter's names, torch 2.6 checkpoint/filesystem.py:502, :517); 0 when none is found.
int world_size_of(const Metadata& md, const Folder& folder);

}  // namespace ucpkit::formats::dcp
