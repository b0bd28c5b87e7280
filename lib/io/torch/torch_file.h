// torch.save files: load (zip or legacy container, any archive prefix) into a Value tree with lazy
// tensors, and save a Value tree as a zip file that Python torch.load reads back.
#pragma once
#include <memory>
#include <span>
#include <string>

#include "io/pickle/value.h"

namespace ucpkit {

class MappedFile;

enum class TorchContainer { Zip, Legacy };

struct TorchFile {
  pickle::ValuePtr root;
  TorchContainer container = TorchContainer::Zip;
  std::string archive_prefix;               // zip only
  std::shared_ptr<const MappedFile> file;   // keeps storages' bytes alive (they also hold it)
};

struct TorchLoadOptions {
  bool verify_crc = false;  // recompute record CRC-32s (zip); off by default: costs a full read
};

// Loads `path`; every error names the file and what is wrong.
TorchFile load_torch_file(const std::string& path, const TorchLoadOptions& options = {});
// Same for bytes in memory (`name` is used in messages).
TorchFile load_torch_bytes(std::span<const uint8_t> bytes, const std::string& name,
                           const TorchLoadOptions& options = {});
// Convenience: just the root value.
pickle::ValuePtr load_torch(const std::string& path);

struct TorchSaveOptions {
  std::string archive_prefix = "archive";
  bool durable = false;  // fsync file and directory before returning
};

// Writes `root` as a zip-format torch file: to a temporary name, then renamed into place. Each
// distinct storage is written once, as one record; generated storages (Storage::generated) are
// streamed window by window, never held whole in memory.
void save_torch_file(const std::string& path, const pickle::ValuePtr& root, const TorchSaveOptions& options = {});

}  // namespace ucpkit
