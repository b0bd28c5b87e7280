// pec-restore --ds-version: the `ds_version` string DeepSpeed pickles into each ZeRO optimizer shard
// (top level and inside optimizer_state_dict, one string object, so the second is a memo reference;
// deepspeed/runtime/engine.py `_save_zero_checkpoint`) rewritten in place, without re-serializing the
// shard: only its data.pkl record is read (a few KiB to MiB; no tensor bytes), the string's bytes are
// replaced and the record's CRC-32 recomputed. Memory does not grow with the shard.
#pragma once
#include <functional>
#include <string>

namespace ucpkit::formats::deepspeed {

struct VersionPatch {
  int rewritten = 0;     // string values replaced
  std::string found;     // the release the shard had ("" when it has no ds_version)
  std::string skipped;   // why nothing was replaced although the release differs (empty otherwise)
};

// Replaces the value of every pickled "ds_version" key of the torch zip file `path` by
// `release_for(value)` when the pickled string has the same length (every release of the supported lines has 6
// characters: 0.16.5, 0.17.1, 0.19.2, ...); a string of another length is left as is and `skipped`
// says so. fsyncs the file when it changed. Throws Error naming the file when it is not a stored zip.
VersionPatch patch_ds_version(const std::string& path, const std::function<std::string(const std::string&)>& release_for);

}  // namespace ucpkit::formats::deepspeed
