// A target file laid out but not written (ucp-load): its path, its pickled root with generated
// (streaming) storages, and what each generated storage is made of. The DeepSpeed writer lays files
// out; files mode saves each at once (save_file), the MPI exchange plans its batches from the sources
// and writes the files out of order, direct mode's --plan prints the sources. Plain data.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "reshard/ucp_info.h"

namespace ucpkit::reshard {

// What a generated storage is made of: bytes [byte_begin, byte_end) are elements [param_offset, ...)
// of the flattened TP slice `slot` of atomic state `state` (index into ModelInfo::states), converted
// to the storage's dtype; bytes outside every source are zeros.
struct StorageSource {
  uint64_t byte_begin, byte_end;
  const Slot* slot;
  int64_t param_offset;
  int state;
};
// The sources of each generated storage of a file, each list sorted by byte_begin.
using StorageSources = std::map<const Storage*, std::vector<StorageSource>>;

// A target file laid out but not written: its path, its root (the generated storages are filled
// while it is written) and its storages' sources (the MPI exchange plans its batches with them;
// direct mode's --plan prints them).
struct LaidOutFile {
  std::string path;
  pickle::ValuePtr root;
  StorageSources sources;
  // The sources of `storage` (empty when it is not one of this file's generated storages).
  const std::vector<StorageSource>& sources_of(const Storage* storage) const;
};

// How a laid-out file is written.
struct WriteOptions {
  bool start_writeback = false;  // start each finished file's write-back (--sync: the final flush overlaps)
};
// Writes `file` (temporary name, then renamed); returns its size in bytes.
uint64_t save_file(const LaidOutFile& file, const WriteOptions& options);

}  // namespace ucpkit::reshard
