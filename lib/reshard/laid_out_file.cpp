// Laid-out target files: their sources, and saving one.
#include "reshard/laid_out_file.h"

#include <filesystem>

#include "io/torch/torch_file.h"

namespace ucpkit::reshard {

const std::vector<StorageSource>& LaidOutFile::sources_of(const Storage* storage) const {
  static const std::vector<StorageSource> none;
  auto it = sources.find(storage);
  return it == sources.end() ? none : it->second;
}

uint64_t save_file(const LaidOutFile& file, const WriteOptions& options) {
  save_torch_file(file.path, file.root, {.start_writeback = options.start_writeback});
  std::error_code ec;
  const auto n = std::filesystem::file_size(file.path, ec);
  return ec ? 0 : n;
}

}  // namespace ucpkit::reshard
