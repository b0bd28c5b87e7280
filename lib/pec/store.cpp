// Store tier: commit protocol and garbage collection.
#include "pec/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <memory>
#include <set>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "formats/pec_store.h"
#include "pec/checksum.h"
#include "pec/crash.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
constexpr const char* kStoreMarker = formats::kPecStoreMarker;

// The processes /proc/locks lists as holding a flock on the file open as `fd`: "pid N, name" for each
// (at most four), "" when unknown (no /proc, another mount namespace).
std::string lock_holders(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  char key[64];
  std::snprintf(key, sizeof key, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  std::string line, out;
  int n = 0;
  const long self = static_cast<long>(::getpid());
  while (std::getline(locks, line)) {
    // "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF" ("->" marks a waiter)
    std::istringstream in(line);
    std::string id, type, mode, rw, dev;
    long pid = 0;
    if (!(in >> id >> type) || type != "FLOCK") continue;
    if (!(in >> mode) || mode == "->") continue;
    if (!(in >> rw >> pid >> dev) || dev != key || pid == self) continue;
    if (n++ == 4) {
      out += ", ...";
      break;
    }
    std::string comm;
    std::ifstream(std::string("/proc/") + std::to_string(pid) + "/comm") >> comm;
    out += (out.empty() ? "" : ", ") + std::string("pid ") + std::to_string(pid) +
           (comm.empty() ? "" : " " + escaped_brief(comm, 16));
  }
  return out;
}

void write_durable(const std::string& path, const std::string& text, const char* crash_label) {
  AtomicFile out(path, true);  // fsynced, renamed into place, its folder fsynced
  const size_t half = text.size() / 2;
  out.write(text.data(), half);
  out.flush(/*keep_buffer=*/true);
  crash_point(crash_label);
  out.write(text.data() + half, text.size() - half);
  out.commit();
}
// The chunks of a file entry and its whole-file digest, chained from the chunk digests (each byte
// is hashed once).
void add_chunks(FileEntry& f, const std::vector<ObjectInfo>& infos) {
  DigestChain chain;
  for (const auto& info : infos) {
    chain.update(info.digest, info.raw_size);
    f.chunks.push_back({info.id, info.raw_size, info.existed ? 0 : info.stored_size});
  }
  f.digest = chain.hex();
}
}  // namespace

Store::Store(std::string dir, Tier tier, StoreOpen how, int zstd_level)
    : dir_(std::move(dir)), tier_(tier), objects_(dir_, zstd_level) {
  std::error_code ec;
  const std::string marker = dir_ + "/" + kStoreMarker;
  const bool is_store = fs::exists(marker);
  if (!is_store) {
    if (how == StoreOpen::existing) fail(dir_, "not a PEC store (no " + std::string(kStoreMarker) + " file)");
    if (fs::exists(dir_) && !fs::is_directory(dir_)) fail(dir_, "exists and is not a folder");
  }
  if (how == StoreOpen::as_found) return;  // planned as found: an absent folder lists as an empty store
  fs::create_directories(dir_ + "/manifests", ec);
  if (ec && !is_store) fail(dir_, "cannot create store folder: " + ec.message());
  fs::create_directories(dir_ + "/objects", ec);
  if (!is_store) write_file_atomic(marker, "ucpkit PEC store, format 1\n", true);
}

Store::~Store() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void Store::lock(bool exclusive) {
  const std::string path = dir_ + "/.lock";
  if (lock_fd_ < 0) {
    // flock needs no write access: a reader opens the lock file read-only, so a read-only store (a
    // mount, another user's files) can be restored from.
    lock_fd_ = ::open(path.c_str(), exclusive ? (O_RDWR | O_CREAT | O_CLOEXEC) : (O_RDONLY | O_CLOEXEC), 0644);
    if (lock_fd_ < 0 && !exclusive && errno == ENOENT) {
      lock_fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      // No lock file and none can be made (read-only store): no writer can lock it either.
      if (lock_fd_ < 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) return;
    }
    if (lock_fd_ < 0) fail(path, std::string("cannot open lock: ") + std::strerror(errno));
  }
  if (::flock(lock_fd_, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
    // Who holds it: a writer (exclusive lock: a pec-save) or readers (shared: pec-restores).
    bool readers = false;
    if (exclusive && ::flock(lock_fd_, LOCK_SH | LOCK_NB) == 0) {
      readers = true;
      ::flock(lock_fd_, LOCK_UN);
    }
    const std::string who = lock_holders(lock_fd_);
    const std::string holders = who.empty() ? "" : " (" + who + ")";
    if (readers)
      throw StoreBusy(dir_ + ": a reader (pec-restore) holds this store's lock" + holders +
                      "; a save can start once it has finished");
    throw StoreBusy(dir_ + ": a writer (pec-save) holds this store's lock" + holders + "; " +
                    (exclusive ? "a save" : "a restore") + " can start once it has finished");
  }
}

std::string Store::manifest_path(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "step-%012lld.json", static_cast<long long>(step));
  return dir_ + "/manifests/" + name;
}

std::vector<int64_t> Store::committed_steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_ + "/manifests", ec)) {
    std::string n = f.path().filename().string();
    if (n.size() == 22 && n.rfind("step-", 0) == 0 && n.substr(17) == ".json") {
      try {
        steps.push_back(std::stoll(n.substr(5, 12)));
      } catch (const std::exception&) {
      }
    }
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::optional<int64_t> Store::latest_step() const {
  auto s = committed_steps();
  if (s.empty()) return std::nullopt;
  return s.back();
}

Manifest Store::load_manifest(int64_t step) const {
  const std::string path = manifest_path(step);
  Manifest m = parse_manifest(read_text_file(path), path);
  if (m.step != step) fail(path, "manifest names step " + std::to_string(m.step));
  return m;
}

FileEntry Store::put_file(const std::string& rel_path, std::span<const uint8_t> bytes, uint64_t chunk_bytes) {
  FileEntry f;
  f.path = rel_path;
  f.size = bytes.size();
  // Chunks hashed, compressed and written in parallel; the whole-file digest is chained from the
  // chunk digests (each byte is hashed once).
  const size_t count = bytes.empty() ? 1 : static_cast<size_t>((bytes.size() + chunk_bytes - 1) / chunk_bytes);
  std::vector<ObjectInfo> infos(count);
  tbb::parallel_for(size_t{0}, count, [&](size_t i) {
    const uint64_t off = i * chunk_bytes;
    infos[i] = objects_.put(bytes.subspan(off, std::min<uint64_t>(chunk_bytes, bytes.size() - off)));
  });
  add_chunks(f, infos);
  return f;
}

FileEntry Store::put_file_from(const std::string& rel_path, const std::string& source,
                               const std::vector<std::pair<uint64_t, uint64_t>>& segments, uint64_t chunk_bytes) {
  FileEntry f;
  f.path = rel_path;
  std::vector<uint64_t> starts;  // logical offset of each segment
  uint64_t size = 0;
  for (const auto& [o, l] : segments) {
    starts.push_back(size);
    size += l;
  }
  f.size = size;
  const int fd = open_input(source, "source file").release();
  // Logical bytes [at, at + n) of the file entry, from the segments, into dst.
  auto read = [&](uint64_t at, size_t n, uint8_t* dst) {
    size_t s = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), at) - starts.begin());
    s = s ? s - 1 : 0;
    while (n > 0) {
      if (s >= segments.size()) fail(source, "changed size while being saved");
      const uint64_t in = at - starts[s];
      if (in >= segments[s].second) {
        ++s;
        continue;
      }
      const size_t want = static_cast<size_t>(std::min<uint64_t>(segments[s].second - in, n));
      ssize_t r = pread_some(fd, dst, want, segments[s].first + in);
      if (r < 0) fail(source, std::string("read failed: ") + std::strerror(errno));
      if (r == 0) fail(source, "changed size while being saved (ends before byte " + std::to_string(segments[s].first + in) + ")");
      dst += r;
      at += static_cast<uint64_t>(r);
      n -= static_cast<size_t>(r);
    }
  };
  const size_t count = size == 0 ? 1 : static_cast<size_t>((size + chunk_bytes - 1) / chunk_bytes);
  std::vector<ObjectInfo> infos(count);
  try {
    tbb::parallel_for(size_t{0}, count, [&](size_t i) {
      const uint64_t off = i * chunk_bytes, len = std::min<uint64_t>(chunk_bytes, size - off);
      infos[i] = objects_.put_stream(len, [&](uint64_t o, size_t n, uint8_t* dst) { read(off + o, n, dst); });
    });
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  add_chunks(f, infos);
  return f;
}

std::vector<uint8_t> Store::read_file(const FileEntry& f) const {
  uint64_t total = 0;
  for (const auto& c : f.chunks) total += c.size;
  if (total != f.size) throw ObjectError(dir_ + ": " + escaped_brief(f.path, 200) + ": chunk sizes do not add up to the file size");
  std::vector<uint8_t> out(f.size);
  DigestChain chain;
  uint64_t off = 0;
  for (const auto& c : f.chunks) {
    objects_.get_into(c.object, c.size, out.data() + off);
    chain.update(std::span<const uint8_t>(out.data() + off, c.size));
    off += c.size;
  }
  if (chain.hex() != f.digest)
    throw ObjectError(dir_ + ": " + escaped_brief(f.path, 200) + ": reassembled file does not match its checksum");
  return out;
}

void Store::write_manifest(const Manifest& m, const std::string& crash_label) {
  write_durable(manifest_path(m.step), manifest_text(m), crash_label.c_str());
  crash_point("manifest renamed");
}

void Store::commit(const Manifest& m) {
  objects_.sync_dirs();
  write_manifest(m, "manifest half written");
}

std::set<std::string> Store::referenced_objects() const {
  std::set<std::string> ids;
  for (int64_t s : committed_steps()) {
    try {
      Manifest m = load_manifest(s);
      auto add = [&](const FileEntry& f) {
        for (const auto& c : f.chunks) ids.insert(c.object);
      };
      for (const auto& f : m.non_expert) add(f);
      for (const auto& e : m.experts)
        for (const auto& f : e.files) add(f);
    } catch (const std::exception&) {
      // A damaged manifest vouches for nothing.
    }
  }
  return ids;
}

ExpertCopySteps Store::expert_copy_steps() const {
  ExpertCopySteps out;
  for (int64_t s : committed_steps()) {
    try {
      Manifest m = load_manifest(s);
      for (const auto& e : m.experts) out[{e.moe_layer, e.expert}].insert(s);
    } catch (const std::exception&) {
      // A damaged manifest covers nothing.
    }
  }
  return out;
}

GcStats Store::collect_garbage(int keep_steps, const ExpertCopySteps* covered) {
  GcStats stats;
  auto steps = committed_steps();
  if (keep_steps < 1) keep_steps = 1;
  std::map<int64_t, Manifest> manifests;
  for (int64_t s : steps) {
    try {
      manifests.emplace(s, load_manifest(s));
    } catch (const std::exception& e) {
      // A damaged manifest is left alone: garbage collection must never make things worse.
      stats.skipped = std::string(e.what()) + "; garbage collection of " + dir_ + " skipped (remove or repair that manifest)";
      return stats;
    }
  }
  const size_t first_target = steps.size() > static_cast<size_t>(keep_steps) ? steps.size() - keep_steps : 0;
  std::set<int64_t> targets(steps.begin() + static_cast<long>(first_target), steps.end());
  // Does the other tier hold a copy of (l, e) at a step in [from, to]?
  auto covered_between = [&](int l, int e, int64_t from, int64_t to) {
    if (!covered) return false;
    auto it = covered->find({l, e});
    if (it == covered->end()) return false;
    auto s = it->second.lower_bound(from);
    return s != it->second.end() && *s <= to;
  };
  // For each manifest, the expert copies still needed: (step -> set of (layer, expert)).
  std::map<int64_t, std::set<std::pair<int, int>>> needed_experts;
  for (int64_t t : targets) {
    const Manifest& tm = manifests.at(t);
    for (int l = 0; l < tm.shape.num_layers(); ++l)
      for (int e = 0; e < tm.shape.experts_per_layer[static_cast<size_t>(l)]; ++e) {
        for (auto it = manifests.upper_bound(t); it != manifests.begin();) {
          --it;
          if (it->second.find_expert(l, e)) {
            if (!covered_between(l, e, it->first, t)) needed_experts[it->first].insert({l, e});
            break;
          }
        }
      }
  }
  // Rewrite the manifests that hold copies no longer needed (older ones also lose their non-expert
  // state), drop the older ones that hold nothing needed.
  for (auto& [s, m] : manifests) {
    const bool target = targets.count(s) > 0;
    auto need = needed_experts.find(s);
    if (!target && need == needed_experts.end()) {
      std::error_code ec;
      fs::remove(manifest_path(s), ec);
      crash_point("gc manifest removed");
      ++stats.manifests_removed;
      continue;
    }
    std::vector<ExpertEntry> kept;
    for (auto& e : m.experts)
      if (need != needed_experts.end() && need->second.count({e.moe_layer, e.expert})) kept.push_back(e);
    bool changed = kept.size() != m.experts.size();
    if (!target) {
      changed = changed || !m.non_expert.empty() || !m.non_expert_pruned;
      m.non_expert.clear();
      m.non_expert_pruned = true;
    }
    if (changed) {
      m.experts = std::move(kept);
      write_manifest(m, "gc manifest half written");
      ++stats.manifests_pruned;
    }
  }
  fsync_dir(dir_ + "/manifests");
  // Objects named by no remaining manifest go.
  std::set<std::string> live;
  for (int64_t s : committed_steps()) {
    Manifest m = load_manifest(s);
    for (const auto& f : m.non_expert)
      for (const auto& c : f.chunks) live.insert(c.object);
    for (const auto& e : m.experts)
      for (const auto& f : e.files)
        for (const auto& c : f.chunks) live.insert(c.object);
  }
  for (const auto& id : objects_.list()) {
    if (live.count(id)) continue;
    std::error_code ec;
    stats.bytes_removed += fs::file_size(objects_.path_of(id), ec);
    objects_.remove(id);
    crash_point("gc object removed");
    ++stats.objects_removed;
  }
  stats.temporaries_removed = objects_.remove_temporaries();
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir_ + "/manifests", ec))
    if (f.path().filename().string().find(".tmp.") != std::string::npos) {
      fs::remove(f.path(), ec);
      ++stats.temporaries_removed;
    }
  return stats;
}

}  // namespace ucpkit::pec
