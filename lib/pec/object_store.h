// Content-addressed, zstd-compressed, checksummed objects: <dir>/objects/<id[0:2]>/<id>, where id is
// the 128-bit digest of the uncompressed bytes; the object file format is formats/pec_object.h.
// Objects are immutable: written to a temporary name and renamed; sync_dirs() then fsyncs every
// object written (one batched pass) and the folders before a manifest may name them.
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/pec_object.h"
#include "pec/checksum.h"

namespace ucpkit::pec {

using formats::ObjectError;  // a missing or damaged object

struct ObjectInfo {
  std::string id;
  uint64_t raw_size = 0;
  uint64_t stored_size = 0;  // bytes of the object file
  bool existed = false;      // already in the store (deduplicated)
  Digest digest;             // of the raw bytes (the id)
};

// Throws ObjectError unless the header of object file `path` is the one of object `id` of
// `raw_size` bytes (as a manifest names it).
void check_object_header(const formats::ObjectHeader& h, const std::string& id, uint64_t raw_size,
                         const std::string& path);

class ObjectStore {
 public:
  explicit ObjectStore(std::string dir, int zstd_level = 3);
  const std::string& dir() const { return dir_; }
  std::string path_of(const std::string& id) const;

  // Stores `bytes` (thread-safe); skips the write when the object is already present, trusted (see
  // trust()) and intact (read back and hashed: reusable()). Not durable until sync_dirs().
  ObjectInfo put(std::span<const uint8_t> bytes);
  // Same for `size` bytes that `read(offset, n, dst)` fills piece by piece (at most kStreamBlock at a
  // time) into a small buffer reused for every piece, which is hashed, compressed and written while
  // it is still in the CPU cache; the object is written to a temporary name and, once its digest is
  // known, renamed to its id (or dropped when that object is already present and trusted).
  ObjectInfo put_stream(uint64_t size, const std::function<void(uint64_t, size_t, uint8_t*)>& read);
  static constexpr size_t kStreamBlock = 1 << 20;
  // Only these objects (those committed manifests name: fsynced before their commit) and the ones
  // this process writes are reused; any other file already at an object's name may be the leftover
  // of a save that crashed before its batched fsync (torn after a power loss) and is rewritten.
  // Without a call every object present is reused.
  void trust(std::set<std::string> ids);
  // The damaged objects put() found at their names and rewrote (one message each, naming the file and
  // the damage), for the caller to warn about.
  std::vector<std::string> repaired() const;
  // Reads, decompresses and verifies an object; throws ObjectError when missing or corrupt.
  std::vector<uint8_t> get(const std::string& id, uint64_t raw_size) const;
  // Same, decompressing straight into `dst` (raw_size bytes).
  void get_into(const std::string& id, uint64_t raw_size, uint8_t* dst) const;
  bool exists(const std::string& id) const;
  // fsyncs every object put() wrote (in parallel), then every object folder a put() created entries
  // in, then the objects folder: after this all objects written so far and their names are durable.
  void sync_dirs();
  // Every object id present on disk, and removal (for garbage collection).
  std::vector<std::string> list() const;
  void remove(const std::string& id);
  // Removes leftovers of interrupted writes (temporary files); returns how many.
  size_t remove_temporaries();

 private:
  // True when object `id` of `raw_size` bytes is on disk with its header and its bytes intact
  // (`stored_size`: its file's size); a damaged one is recorded in repaired_ and false returned.
  bool reusable(const std::string& id, uint64_t raw_size, uint64_t* stored_size);

  std::string dir_;
  int level_;
  mutable std::mutex mutex_;
  std::vector<std::string> repaired_;
  std::set<std::string> touched_dirs_;
  std::vector<std::string> unsynced_;  // objects written and not yet fsynced
  bool trust_all_ = true;
  std::set<std::string> trusted_;
};

}  // namespace ucpkit::pec
