// Streaming restore writer: chunks stream object file -> zstd window -> digest -> pwrite.
#include "pec/restore_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_pipeline.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <mutex>
#include <numeric>
#include <tuple>

#include "core/crc32.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/staging.h"
#include "core/mapped_file.h"
#include "formats/pec_object.h"
#include "parallel/threads.h"
#include "pec/checkpoint.h"
#include "pec/checksum.h"
#include "pec/crash.h"
#include "pec/object_store.h"
#include "pec/record_crcs.h"
#include "pec/store.h"
#include "io/zip/zip_records.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
constexpr size_t kInBlock = size_t{1} << 20;  // zeros written and bytes read back per call
// Per worker: one object reader.
constexpr uint64_t kPerWorker = formats::ObjectReader::kMemory;
// The rest of the process: code, TBB, manifests, report.
constexpr uint64_t kBase = uint64_t{48} << 20;

// Bytes [stream, stream + length) of a chunk go to [file, file + length) of the output file; with
// `record` set their CRC-32 is computed on the way.
struct Seg {
  uint64_t stream = 0, file = 0, length = 0;
  const std::string* record = nullptr;
  uint64_t range_at = 0, range_length = 0;  // the expert range (absolute in the file) the bytes belong to
  int64_t expect = -1;                      // its CRC-32 as its save recorded it (-1: none recorded)
};

void create_sized(const std::string& path, uint64_t size) {
  fs::create_directories(fs::path(path).parent_path());
  UniqueFd f = open_or_fail(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (::ftruncate(f.get(), static_cast<off_t>(size)) != 0) fail(path, std::string("cannot size: ") + std::strerror(errno));
}

// The part of `map` (stream -> file placement of a whole stored entry) that chunk [off, off + n) covers,
// with stream offsets relative to the chunk.
std::vector<Seg> slice(const std::vector<Seg>& map, uint64_t off, uint64_t n) {
  std::vector<Seg> out;
  for (const auto& s : map) {
    uint64_t lo = std::max(off, s.stream), hi = std::min(off + n, s.stream + s.length);
    if (lo < hi) out.push_back({lo - off, s.file + (lo - s.stream), hi - lo, s.record, s.range_at, s.range_length, s.expect});
  }
  return out;
}
}  // namespace

struct RestoreWriter::Job {
  std::string object_path, id;
  uint64_t raw_size = 0;
  std::string out;  // output file
  std::string out_rel;
  std::vector<Seg> segs;
  size_t group = 0;  // (copy, file) or file the job belongs to
  // Results.
  Digest digest;
  std::string error;
  std::vector<CrcPiece> pieces;
  std::exception_ptr fatal;
};

struct RestoreWriter::CutFile {
  uint64_t size = 0;
  std::map<std::string, ZipRecord> records;
  bool has_table = false;  // the target save recorded its expert ranges' CRC-32s
  std::map<std::string, std::vector<RangeCrc>> table;  // record -> the target save's expert ranges in it
  std::vector<CrcPiece> pieces;
  std::set<std::string> touched;
};

namespace {
// One job per stored chunk of `f`, placed in `out` by `map` (the whole entry's stream -> file map).
template <class JobT>
void add_chunk_jobs(std::vector<JobT>& jobs, const Store& store, const FileEntry& f, const std::string& out,
                    const std::vector<Seg>& map, size_t group) {
  uint64_t off = 0;
  for (const auto& c : f.chunks) {
    JobT j;
    j.object_path = store.objects().path_of(c.object);
    j.id = c.object;
    j.raw_size = c.size;
    j.out = out;
    j.out_rel = f.path;
    j.segs = slice(map, off, c.size);
    j.group = group;
    jobs.push_back(std::move(j));
    off += c.size;
  }
}

// Streams one object into its segments: read a block, decompress into the window, hash, pwrite.
void stream_job(const std::string& object_path, const std::string& id, uint64_t raw_size, const std::string& out_path,
                const std::vector<Seg>& segs, const std::string& out_rel, formats::ObjectReader& reader,
                Digest& digest_out, std::vector<CrcPiece>& pieces) {
  const formats::ObjectHeader header = reader.open(object_path);
  check_object_header(header, id, raw_size, object_path);
  const Digest want{header.digest_hi, header.digest_lo};
  UniqueFd out = open_or_fail(out_path, O_WRONLY);

  DigestStream hash;
  std::vector<uint32_t> crc(segs.size(), 0);
  uint64_t produced = 0;
  size_t first = 0;
  reader.read([&](const uint8_t* data, size_t n) {
    hash.update({data, n});
    const uint64_t s0 = produced, s1 = produced + n;
    while (first < segs.size() && segs[first].stream + segs[first].length <= s0) ++first;
    for (size_t k = first; k < segs.size() && segs[k].stream < s1; ++k) {
      const Seg& s = segs[k];
      const uint64_t lo = std::max(s0, s.stream), hi = std::min(s1, s.stream + s.length);
      if (lo >= hi) continue;
      pwrite_all(out.get(), data + (lo - s0), hi - lo, s.file + (lo - s.stream), out_path);
      if (s.record) crc[k] = crc32_update(crc[k], {data + (lo - s0), hi - lo});
    }
    produced = s1;
  });
  digest_out = hash.value();
  if (!(digest_out == want)) throw ObjectError(object_path + ": corrupt object (checksum mismatch)");
  for (size_t k = 0; k < segs.size(); ++k)
    if (segs[k].record)
      pieces.push_back({out_rel, *segs[k].record, segs[k].file, segs[k].length, crc[k], -1, segs[k].range_at,
                        segs[k].range_length, segs[k].expect});
  crash_point("restore chunk written");
}
}  // namespace

void RestoreWriter::check_memory(uint64_t memory_bytes) {
  if (memory_bytes < kBase + kPerWorker)
    throw UsageError("--memory-mb " + std::to_string(memory_bytes >> 20) + " is too small: restore needs at least " +
                     std::to_string((kBase + kPerWorker + (1 << 20) - 1) >> 20) + " MiB");
}

RestoreWriter::RestoreWriter(std::string dir, uint64_t memory_bytes, int rank, int world)
    : dir_(std::move(dir)), rank_(rank), world_(std::max(world, 1)) {
  check_memory(memory_bytes);
  const uint64_t fit = (memory_bytes - kBase) / kPerWorker;
  // I/O waits overlap with decompression: a few more streams than cores, bounded by the budget.
  const auto cores = static_cast<uint64_t>(parallel::thread_count(0));
  workers_ = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(fit, std::max<uint64_t>(4, 2 * cores))));
}

RestoreWriter::~RestoreWriter() = default;

void RestoreWriter::assign(const std::vector<std::pair<std::string, uint64_t>>& files) {
  std::vector<std::pair<std::string, uint64_t>> order = files;
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (a.second != b.second) return a.second > b.second;
    return a.first < b.first;
  });
  std::vector<uint64_t> load(static_cast<size_t>(world_), 0);
  for (const auto& [path, bytes] : order) {
    if (owner_.count(path)) continue;
    size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[path] = static_cast<int>(r);
    load[r] += bytes;
  }
}

bool RestoreWriter::owns(const std::string& path) const {
  if (world_ == 1) return true;
  auto it = owner_.find(path);
  if (it != owner_.end()) return it->second == rank_;
  uint64_t h = 1469598103934665603ull;  // FNV-1a: the same on every rank
  for (unsigned char c : path) h = (h ^ c) * 1099511628211ull;
  return static_cast<int>(h % static_cast<uint64_t>(world_)) == rank_;
}

void RestoreWriter::run(std::vector<Job>& jobs) {
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return jobs[a].raw_size > jobs[b].raw_size; });
  tbb::enumerable_thread_specific<formats::ObjectReader> readers;
  size_t next = 0;
  // More streams than cores (I/O waits overlap).
  parallel::in_io_arena(workers_, [&] {
    tbb::parallel_pipeline(
        static_cast<size_t>(workers_),
        tbb::make_filter<void, size_t>(tbb::filter_mode::serial_in_order,
                                       [&](tbb::flow_control& fc) -> size_t {
                                         check_interrupted();  // SIGINT/SIGTERM: stop at the next chunk
                                         if (next == order.size()) {
                                           fc.stop();
                                           return 0;
                                         }
                                         return order[next++];
                                       }) &
            tbb::make_filter<size_t, void>(tbb::filter_mode::parallel, [&](size_t i) {
              Job& j = jobs[i];
              try {
                stream_job(j.object_path, j.id, j.raw_size, j.out, j.segs, j.out_rel, readers.local(), j.digest, j.pieces);
              } catch (const ObjectError& e) {
                j.error = e.what();
                j.pieces.clear();
              } catch (...) {
                j.fatal = std::current_exception();
              }
            }));
  });
  for (auto& j : jobs)
    if (j.fatal) std::rethrow_exception(j.fatal);
}

void RestoreWriter::write_non_expert(const Store& store, const std::vector<FileEntry>& files, int64_t step) {
  step_ = step;
  std::vector<Job> jobs;
  std::vector<const FileEntry*> groups;
  for (const auto& f : files) {
    non_expert_.insert(f.path);
    if (!owns(f.path)) continue;
    uint64_t total = 0;
    for (const auto& c : f.chunks) total += c.size;
    if (total != f.size) throw ObjectError(store.dir() + ": " + escaped_brief(f.path, 200) + ": chunk sizes do not add up to the file size");
    std::vector<Seg> map;
    uint64_t size = f.size;
    if (!f.cut) {
      map.push_back({0, 0, f.size, nullptr});
    } else {
      // The stored bytes are the file without its expert ranges (checkpoint.cpp, read_non_expert).
      size = f.cut->file_size;
      uint64_t pos = 0, from = 0;
      for (const auto& [o, l] : f.cut->cut) {
        if (o < pos || o + l > size || from + (o - pos) > f.size) fail(f.path, "stored cut list does not fit the file");
        if (o > pos) map.push_back({from, pos, o - pos, nullptr});
        from += o - pos;
        pos = o + l;
      }
      if (from + (size - pos) != f.size) fail(f.path, "stored non-expert bytes do not fit the file size");
      if (size > pos) map.push_back({from, pos, size - pos, nullptr});
    }
    const std::string out = (fs::path(dir_) / f.path).string();
    create_sized(out, size);
    written_.insert(f.path);
    bytes_written_ += size;
    auto cf = std::make_unique<CutFile>();
    cf->size = size;
    if (f.range_crcs) {
      cf->has_table = true;
      for (const auto& r : *f.range_crcs) cf->table[r.record].push_back(r);
    }
    cut_[f.path] = std::move(cf);
    add_chunk_jobs(jobs, store, f, out, map, groups.size());
    groups.push_back(&f);
  }
  run(jobs);
  std::vector<DigestChain> chains(groups.size());
  for (const auto& j : jobs) {
    if (!j.error.empty()) throw ObjectError(j.error);
    chains[j.group].update(j.digest, j.raw_size);
  }
  for (size_t g = 0; g < groups.size(); ++g)
    if (chains[g].hex() != groups[g]->digest)
      throw ObjectError(store.dir() + ": " + groups[g]->path + ": reassembled file does not match its checksum");
}

void RestoreWriter::check_mixed_record(const std::string& path, const std::string& name, const ZipRecord& r,
                                      const std::vector<const CrcPiece*>& ps, std::vector<RangeCrc>& slots,
                                      const std::function<uint32_t(uint64_t, uint64_t)>& crc_of) const {
  const std::string rec = "record '" + escaped_brief(name) + "'";
  // Each expert range restored from a save that recorded its CRC-32 must still have it (a fragment of a
  // store written by an older pec-save carries none and is taken as it is).
  for (size_t i = 0; i < ps.size();) {
    const CrcPiece& first = *ps[i];
    uint32_t c = 0;
    uint64_t pos = first.range_offset;
    size_t j = i;
    for (; j < ps.size() && ps[j]->range_offset == first.range_offset && ps[j]->step == first.step; ++j) {
      if (ps[j]->offset != pos) break;
      c = crc32_combine(c, ps[j]->crc, ps[j]->length);
      pos += ps[j]->length;
    }
    if (j == i) ++j;  // (a piece that does not start its range cannot be checked)
    if (first.expect >= 0 && pos == first.range_offset + first.range_length && c != static_cast<uint32_t>(first.expect)) {
      fail(path, rec + ": the expert fragment at byte " + std::to_string(first.range_offset) + " restored from step " +
                     std::to_string(first.step) + " has CRC-32 " + crc_hex(c) + ", not the " +
                     crc_hex(static_cast<uint32_t>(first.expect)) + " that save recorded (the store holds a " +
                     "damaged fragment); refusing rather than writing a fresh CRC over the damage");
    }
    i = j;
  }
  // The target save's own bytes: its non-expert bytes with its expert ranges' recorded CRC-32s must give
  // the source's record CRC.
  std::sort(slots.begin(), slots.end(), [](const RangeCrc& a, const RangeCrc& b) { return a.offset < b.offset; });
  uint64_t pos = 0;
  uint32_t c = 0;
  for (const auto& s : slots) {
    if (s.offset < pos || s.offset + s.length > r.size) fail(path, rec + ": overlapping or outlying expert ranges in the stored CRC table");
    if (s.offset > pos) c = crc32_combine(c, crc_of(r.data_offset + pos, s.offset - pos), s.offset - pos);
    c = crc32_combine(c, s.crc, s.length);
    pos = s.offset + s.length;
  }
  if (r.size > pos) c = crc32_combine(c, crc_of(r.data_offset + pos, r.size - pos), r.size - pos);
  if (c != r.crc32)
    fail(path, rec + ": the bytes saved at step " + std::to_string(step_) + " give CRC-32 " + crc_hex(c) + ", not the " +
                   crc_hex(r.crc32) + " the saved checkpoint recorded (the source was damaged when it was saved, " +
                   "or the store since); refusing rather than writing a fresh CRC over the damage");
}

const RestoreWriter::CutFile& RestoreWriter::cut_file(const std::string& path) {
  auto it = cut_.find(path);
  if (it == cut_.end()) fail(path, "expert fragment saved for a file the non-expert state lacks");
  CutFile& cf = *it->second;
  if (cf.records.empty()) {
    auto f = MappedFile::open((fs::path(dir_) / path).string());  // touches the zip directory pages only
    cf.records = read_zip_directory(f->bytes(), path);
  }
  return cf;
}

std::vector<CopyOutcome> RestoreWriter::write_experts(const std::vector<ExpertCopy>& copies) {
  std::vector<CopyOutcome> out(copies.size());
  std::vector<Job> jobs;
  struct Group {
    size_t copy;
    const FileEntry* file;
    const Store* store;
  };
  std::vector<Group> groups;
  for (size_t ci = 0; ci < copies.size(); ++ci) {
    const Store& store = *copies[ci].store;
    for (const auto& f : copies[ci].entry->files) {
      if (!owns(f.path)) continue;
      if (f.ranges && !non_expert_.count(f.path))
        fail(f.path, "expert fragment saved for a file the non-expert state lacks");
      uint64_t total = 0;
      for (const auto& c : f.chunks) total += c.size;
      if (total != f.size) {
        if (out[ci].error.empty()) out[ci].error = store.dir() + ": " + f.path + ": chunk sizes do not add up to the file size";
        continue;
      }
      std::vector<Seg> map;
      const std::string out_path = (fs::path(dir_) / f.path).string();
      if (!f.ranges) {
        create_sized(out_path, f.size);
        out[ci].whole_files.push_back(f.path);
        map.push_back({0, 0, f.size, nullptr});
      } else {
        const CutFile& cf = cut_file(f.path);
        std::map<std::tuple<std::string, uint64_t, uint64_t>, uint32_t> recorded;
        if (f.range_crcs)
          for (const auto& r : *f.range_crcs) recorded[{r.record, r.offset, r.length}] = r.crc;
        uint64_t off = 0;
        for (const auto& r : *f.ranges) {
          auto rec = cf.records.find(r.record);
          if (rec == cf.records.end()) fail(f.path, "has no record '" + escaped_brief(r.record) + "' for a saved expert fragment");
          if (r.offset + r.length > rec->second.size)
            fail(f.path, "record '" + escaped_brief(r.record) + "' is smaller than the saved expert fragment");
          if (off + r.length > f.size) fail(f.path, "saved expert fragment shorter than its ranges");
          const uint64_t at = rec->second.data_offset + r.offset;
          auto c = recorded.find({r.record, r.offset, r.length});
          map.push_back({off, at, r.length, &rec->first, at, r.length, c == recorded.end() ? -1 : int64_t{c->second}});
          out[ci].fragments.push_back({f.path, {at, r.length}});
          off += r.length;
        }
        if (off != f.size) fail(f.path, "saved expert fragment longer than its ranges");
      }
      add_chunk_jobs(jobs, store, f, out_path, map, groups.size());
      groups.push_back({ci, &f, &store});
    }
  }
  run(jobs);
  std::vector<DigestChain> chains(groups.size());
  std::vector<bool> broken(groups.size(), false);
  for (auto& j : jobs) {
    CopyOutcome& o = out[groups[j.group].copy];
    if (!j.error.empty()) {
      broken[j.group] = true;
      if (o.error.empty()) o.error = j.error;
      continue;
    }
    chains[j.group].update(j.digest, j.raw_size);
    for (auto& p : j.pieces) {
      p.step = copies[groups[j.group].copy].step;
      o.pieces.push_back(std::move(p));
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    CopyOutcome& o = out[groups[g].copy];
    if (!broken[g] && chains[g].hex() != groups[g].file->digest && o.error.empty())
      o.error = groups[g].store->dir() + ": " + groups[g].file->path + ": reassembled file does not match its checksum";
  }
  for (auto& o : out)
    if (!o.error.empty()) o.pieces.clear();
  for (auto& o : out)
    for (const auto& w : o.whole_files) written_.insert(w);
  return out;
}

void RestoreWriter::discard(const CopyOutcome& o) {
  static const std::vector<uint8_t> zeros(kInBlock, 0);
  for (const auto& [path, range] : o.fragments) {
    const std::string p = (fs::path(dir_) / path).string();
    UniqueFd f = open_or_fail(p, O_WRONLY);
    for (uint64_t done = 0; done < range.second;) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), range.second - done));
      pwrite_all(f.get(), zeros.data(), n, range.first + done, p);
      done += n;
    }
  }
  for (const auto& w : o.whole_files) {
    std::error_code ec;
    fs::remove(fs::path(dir_) / w, ec);
    written_.erase(w);
  }
}

void RestoreWriter::accept(CopyOutcome&& o) {
  for (auto& p : o.pieces) {
    CutFile& cf = *cut_.at(p.file);
    cf.touched.insert(p.record);
    cf.pieces.push_back(std::move(p));
  }
}

void RestoreWriter::finish() {
  // Bytes already counted for non-expert files; whole expert files are counted here.
  for (const auto& w : written_)
    if (!cut_.count(w)) bytes_written_ += fs::file_size(fs::path(dir_) / w);
  std::vector<uint8_t> buf;
  for (auto& [path, cfp] : cut_) {
    CutFile& cf = *cfp;
    if (cf.touched.empty()) continue;
    const std::string p = (fs::path(dir_) / path).string();
    UniqueFd f = open_or_fail(p, O_RDWR);
    auto crc_of = [&](uint64_t off, uint64_t n) {  // bytes written before (non-expert), read back
      if (buf.empty()) buf.resize(kInBlock);
      uint32_t c = 0;
      for (uint64_t done = 0; done < n;) {
        size_t k = static_cast<size_t>(std::min<uint64_t>(buf.size(), n - done));
        pread_exact(f.get(), buf.data(), k, off + done, p);
        c = crc32_update(c, {buf.data(), k});
        done += k;
      }
      return c;
    };
    std::map<std::string, std::vector<const CrcPiece*>> by_record;
    for (const auto& piece : cf.pieces) by_record[piece.record].push_back(&piece);
    for (const auto& name : cf.touched) {
      const ZipRecord& r = cf.records.at(name);
      auto& ps = by_record[name];
      std::sort(ps.begin(), ps.end(), [](const CrcPiece* a, const CrcPiece* b) { return a->offset < b->offset; });
      uint64_t pos = r.data_offset;
      const uint64_t end = r.data_offset + r.size;
      uint32_t crc = 0;
      bool overlap = false;
      for (const CrcPiece* piece : ps) {
        if (piece->offset < pos || piece->offset + piece->length > end) {
          overlap = true;
          break;
        }
        if (piece->offset > pos) crc = crc32_combine(crc, crc_of(pos, piece->offset - pos), piece->offset - pos);
        crc = crc32_combine(crc, piece->crc, piece->length);
        pos = piece->offset + piece->length;
      }
      if (overlap) {
        crc = crc_of(r.data_offset, r.size);
      } else if (end > pos) {
        crc = crc32_combine(crc, crc_of(pos, end - pos), end - pos);
      }
      // The central entry still holds the CRC the record had in the source (it is non-expert bytes).
      if (crc == r.crc32) continue;  // nothing to write: the bytes are the source's
      const bool one_save = std::all_of(ps.begin(), ps.end(), [&](const CrcPiece* q) { return q->step == step_; });
      if (one_save)
        fail(path, "record '" + escaped_brief(name) + "': CRC-32 of the restored bytes " + crc_hex(crc) + " differs from the " +
                    crc_hex(r.crc32) + " the saved checkpoint recorded (the source was damaged when it was saved, " +
                    "or the store since); refusing rather than writing a fresh CRC over the damage");
      if (cf.has_table) check_mixed_record(path, name, r, ps, cf.table[name], crc_of);
      // Fragments of older saves replaced some of the source's bytes: the source CRC cannot hold.
      store_zip_crc(
          cf.size, r, crc, [&](uint64_t off, size_t n, uint8_t* dst) { pread_exact(f.get(), dst, n, off, p); },
          [&](uint64_t off, uint32_t v) {
            uint8_t b[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
                            static_cast<uint8_t>(v >> 24)};
            pwrite_all(f.get(), b, 4, off, p);
          });
    }
  }
  std::vector<std::string> files(written_.begin(), written_.end());
  std::exception_ptr error;
  std::mutex m;
  parallel::in_io_arena(workers_, [&] {
    tbb::parallel_for(size_t{0}, files.size(), [&](size_t i) {
      const std::string p = (fs::path(dir_) / files[i]).string();
      UniqueFd f(p, O_RDONLY);
      if (f.get() < 0 || ::fsync(f.get()) != 0) {
        std::lock_guard<std::mutex> lock(m);
        if (!error) error = std::make_exception_ptr(Error(p + ": fsync failed: " + std::strerror(errno)));
      }
    });
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace ucpkit::pec
