// One tier of the PEC store (durable folder, or a fast tier such as /dev/shm/...):
//   <dir>/objects/..            content-addressed objects (object_store.h)
//   <dir>/manifests/step-<N>.json   one per committed step; its atomic rename is the commit
//   <dir>/.lock                 flock: one writer at a time
// A step is committed iff its manifest exists; every object a manifest names was written and fsynced,
// and its folder fsynced, before the manifest was created.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "pec/manifest.h"
#include "pec/object_store.h"
#include "pec/tier.h"

namespace ucpkit::pec {

// The store's lock is held by another process (a reason to try again later, not a damaged store).
class StoreBusy : public Error {
 public:
  using Error::Error;
};

struct GcStats {
  size_t manifests_removed = 0;
  size_t manifests_pruned = 0;
  size_t objects_removed = 0;
  uint64_t bytes_removed = 0;
  size_t temporaries_removed = 0;
  std::string skipped;  // why garbage collection did nothing (a damaged manifest), empty when it ran
};

// Steps at which a tier holds a committed copy of each expert: (moe_layer, expert) -> steps.
using ExpertCopySteps = std::map<std::pair<int, int>, std::set<int64_t>>;

// How a tier folder is opened: it must already be a store (restore), it is created when absent
// (save), or an absent one reads as an empty store and nothing is created (`pec-save --plan`).
enum class StoreOpen { existing, create, as_found };

class Store {
 public:
  // Opens a tier folder as `how` says. Throws Error when it is not a PEC store (StoreOpen::existing)
  // or cannot be created.
  Store(std::string dir, Tier tier, StoreOpen how, int zstd_level = 3);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const std::string& dir() const { return dir_; }
  Tier tier() const { return tier_; }
  ObjectStore& objects() { return objects_; }
  const ObjectStore& objects() const { return objects_; }

  // Exclusive (writer) or shared (reader) advisory lock on the tier, held until destruction. When
  // another process holds it, throws StoreBusy naming the holders (readers: pec-restore; a writer:
  // pec-save) with their process ids and names as /proc/locks and /proc/<pid>/comm give them.
  void lock(bool exclusive);

  std::vector<int64_t> committed_steps() const;  // ascending
  std::optional<int64_t> latest_step() const;
  std::string manifest_path(int64_t step) const;
  Manifest load_manifest(int64_t step) const;  // throws Error when damaged

  // Stores a file's bytes as chunks of at most `chunk_bytes`.
  FileEntry put_file(const std::string& rel_path, std::span<const uint8_t> bytes, uint64_t chunk_bytes);
  // Same for bytes read from `segments` (absolute offset, length; concatenated) of the file at
  // `source`, streamed (ObjectStore::put_stream): each byte is read once with pread into a small
  // buffer that stays in the CPU cache while it is hashed and written; no mapping of the source (page
  // faults cost much more than reads on a virtual machine) and no copy of a cut file.
  FileEntry put_file_from(const std::string& rel_path, const std::string& source,
                          const std::vector<std::pair<uint64_t, uint64_t>>& segments, uint64_t chunk_bytes);
  // Reads a file back, verifying every chunk and the whole-file digest (throws ObjectError).
  std::vector<uint8_t> read_file(const FileEntry& f) const;

  // Makes all objects written so far durable, then writes the manifest atomically (temp + fsync +
  // rename + fsync of the folder). After this returns the step is committed.
  void commit(const Manifest& m);

  // Keeps what restoring each of the latest `keep_steps` committed steps needs from this tier: their
  // manifests and non-expert state, and for every expert its newest copy at or before each of them.
  // Older manifests still needed for an expert copy are rewritten without their non-expert state;
  // the rest are removed, then every object no manifest names (incl. leftovers of crashed saves).
  // With `covered` (the copies another tier holds, e.g. the durable tier seen from the fast tier), an
  // expert copy at step s is kept for a target t only when that tier has no copy at a step in [s, t]:
  // this tier then holds only the experts the other tier does not have as new, plus the non-expert
  // state of the kept steps. When a manifest is damaged nothing is collected (`skipped` says why).
  GcStats collect_garbage(int keep_steps, const ExpertCopySteps* covered = nullptr);

  // Every object a readable committed manifest of this tier names (durable: fsynced before its commit).
  std::set<std::string> referenced_objects() const;

  // The steps of every expert copy named by a readable manifest of this tier.
  ExpertCopySteps expert_copy_steps() const;

 private:
  void write_manifest(const Manifest& m, const std::string& crash_label);
  std::string dir_;
  Tier tier_;
  ObjectStore objects_;
  int lock_fd_ = -1;
};

}  // namespace ucpkit::pec
