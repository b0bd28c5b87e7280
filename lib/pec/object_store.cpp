// Content-addressed object files.
#include "pec/object_store.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <tbb/parallel_for.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/atomic_file.h"
#include "core/file_io.h"
#include "core/mapped_file.h"
#include "pec/checksum.h"
#include "pec/crash.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {
constexpr size_t kHeader = formats::kObjectHeader;

// The header of an object of `size` raw bytes with digest `d`, as level `level` writes it.
std::array<uint8_t, kHeader> header_of(int level, uint64_t size, const Digest& d) {
  return formats::ObjectHeader{level == 0, size, d.hi, d.lo}.encode();
}

}  // namespace

void check_object_header(const formats::ObjectHeader& h, const std::string& id, uint64_t raw_size,
                         const std::string& path) {
  if (h.raw_size != raw_size)
    throw ObjectError(path + ": size " + std::to_string(h.raw_size) + " differs from the manifest's " +
                      std::to_string(raw_size));
  if (Digest{h.digest_hi, h.digest_lo}.hex() != id)
    throw ObjectError(path + ": header checksum does not match the object id");
}

ObjectStore::ObjectStore(std::string dir, int zstd_level) : dir_(std::move(dir)), level_(zstd_level) {}

std::string ObjectStore::path_of(const std::string& id) const {
  return dir_ + "/objects/" + id.substr(0, 2) + "/" + id;
}

bool ObjectStore::exists(const std::string& id) const { return fs::exists(path_of(id)); }

ObjectInfo ObjectStore::put(std::span<const uint8_t> bytes) {
  ObjectInfo info;
  Digest d = digest(bytes);
  info.id = d.hex();
  info.digest = d;
  info.raw_size = bytes.size();
  const std::string path = path_of(info.id);
  const std::string sub = fs::path(path).parent_path().string();
  std::error_code ec;
  bool trusted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    trusted = trust_all_ || trusted_.count(info.id);
  }
  if (uint64_t size = 0; trusted && reusable(info.id, info.raw_size, &size)) {
    info.stored_size = size;
    info.existed = true;
    // The object may have been renamed into place by a save that crashed before fsyncing its folder:
    // the commit that now names it must make that folder entry durable too.
    std::lock_guard<std::mutex> lock(mutex_);
    touched_dirs_.insert(sub);
    return info;
  }
  fs::create_directories(sub, ec);
  if (ec) fail(sub, "cannot create folder: " + ec.message());

  const auto header = header_of(level_, bytes.size(), d);
  std::unique_ptr<uint8_t[]> buf;
  std::span<const uint8_t> payload = bytes;  // level 0: the bytes as they are
  if (level_ != 0) {
    const size_t cap = ZSTD_compressBound(bytes.size());
    buf.reset(new uint8_t[cap]);  // uninitialized: zero-filling it is measurable
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level_);
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
    size_t n = ZSTD_compress2(cctx, buf.get(), cap, bytes.data(), bytes.size());
    ZSTD_freeCCtx(cctx);
    if (ZSTD_isError(n)) fail(path, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    payload = {buf.get(), n};
  }
  const uint64_t total = kHeader + payload.size();

  AtomicFile out(path);  // beside the object; removed unless renamed into place
  out.write(header.data(), kHeader);
  const size_t half = payload.size() / 2;
  out.write(payload.data(), half);
  out.flush(/*keep_buffer=*/true);
  crash_point("object half written");
  out.write(payload.data() + half, payload.size() - half);
  // Start the write-back now (asynchronously): the disk writes this object while the next ones are
  // hashed and written, and the batched fsync pass before the commit finds little left to wait for.
  out.start_writeback();
  out.commit();
  crash_point("object renamed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    touched_dirs_.insert(sub);
    unsynced_.push_back(path);
    trusted_.insert(info.id);
  }
  info.stored_size = total;
  return info;
}

ObjectInfo ObjectStore::put_stream(uint64_t size, const std::function<void(uint64_t, size_t, uint8_t*)>& read) {
  thread_local std::vector<uint8_t> in(kStreamBlock), out_buf;  // reused: stay in the CPU cache
  const std::string objects = dir_ + "/objects";
  // Written as `objects/.put.tmp.<pid>.<n>` (AtomicFile's temporary name of `objects/.put`), renamed to
  // the object's name once its digest is known, removed otherwise.
  AtomicFile out(objects + "/.put");
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(nullptr, ZSTD_freeCCtx);
  ObjectInfo info;
  uint64_t total = kHeader;
  const uint8_t zeros[kHeader] = {};
  out.write(zeros, kHeader);  // the header, written once the digest is known
  if (level_ != 0) {
    cctx.reset(ZSTD_createCCtx());
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level_);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
    ZSTD_CCtx_setPledgedSrcSize(cctx.get(), size);
    out_buf.resize(ZSTD_CStreamOutSize());
  }
  DigestStream ds;
  bool halfway = false;
  for (uint64_t off = 0; off < size || (off == 0 && size == 0);) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kStreamBlock, size - off));
    if (n) read(off, n, in.data());
    ds.update(std::span<const uint8_t>(in.data(), n));
    off += n;
    if (level_ == 0) {
      out.write(in.data(), n);
      total += n;
    } else {
      ZSTD_inBuffer src{in.data(), n, 0};
      const ZSTD_EndDirective mode = off == size ? ZSTD_e_end : ZSTD_e_continue;
      size_t left;
      do {
        ZSTD_outBuffer dst{out_buf.data(), out_buf.size(), 0};
        left = ZSTD_compressStream2(cctx.get(), &dst, &src, mode);
        if (ZSTD_isError(left)) fail(objects, std::string("zstd compression failed: ") + ZSTD_getErrorName(left));
        out.write(out_buf.data(), dst.pos);
        total += dst.pos;
      } while (mode == ZSTD_e_end ? left != 0 : src.pos < src.size);
    }
    if (!halfway && off * 2 >= size) {
      halfway = true;
      out.flush(/*keep_buffer=*/true);
      crash_point("object half written");
    }
    if (size == 0) break;
  }
  const Digest d = ds.value();
  info.id = d.hex();
  info.digest = d;
  info.raw_size = size;
  const auto header = header_of(level_, size, d);
  out.pwrite_at(0, {header.data(), kHeader});
  const std::string path = path_of(info.id);
  const std::string sub = fs::path(path).parent_path().string();
  bool trusted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    trusted = trust_all_ || trusted_.count(info.id);
  }
  std::error_code ec;
  if (uint64_t have = 0; trusted && reusable(info.id, size, &have)) {  // already stored: this copy is not needed
    info.stored_size = have;
    info.existed = true;
    std::lock_guard<std::mutex> lock(mutex_);
    touched_dirs_.insert(sub);  // see put(): the entry may not be durable yet
    return info;
  }
  out.start_writeback();  // see put()
  fs::create_directories(sub, ec);
  if (ec) fail(sub, "cannot create folder: " + ec.message());
  out.commit_as(path);
  crash_point("object renamed");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    touched_dirs_.insert(sub);  // (the objects folder, which held the temporary name, is always fsynced)
    unsynced_.push_back(path);
    trusted_.insert(info.id);
  }
  info.stored_size = total;
  return info;
}

bool ObjectStore::reusable(const std::string& id, uint64_t raw_size, uint64_t* stored_size) {
  const std::string path = path_of(id);
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return false;  // absent (or unreadable): written anew
  // A committed object can still be damaged afterwards (a torn write-back after a power cut leaves it
  // empty or with zeroed blocks; a disk error): naming it again would spread the damage to this save's
  // manifest too. The whole object is read back and hashed; rewriting it also repairs the older steps
  // that name it (same id, same bytes).
  thread_local formats::ObjectReader reader;
  try {
    check_object_header(reader.open(path), id, raw_size, path);
    DigestStream ds;
    reader.read([&](const uint8_t* p, size_t n) { ds.update({p, n}); });
    if (ds.value().hex() != id) throw ObjectError(path + ": corrupt object (checksum mismatch)");
  } catch (const ObjectError& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    repaired_.push_back(e.what());
    return false;
  }
  *stored_size = size;
  return true;
}

std::vector<uint8_t> ObjectStore::get(const std::string& id, uint64_t raw_size) const {
  std::vector<uint8_t> out(raw_size);
  get_into(id, raw_size, out.data());
  return out;
}

void ObjectStore::get_into(const std::string& id, uint64_t raw_size, uint8_t* dst) const {
  const std::string path = path_of(id);
  if (!fs::exists(path)) throw ObjectError(path + ": object missing");
  std::shared_ptr<const MappedFile> f;
  try {
    f = MappedFile::open(path);
  } catch (const std::exception& e) {
    throw ObjectError(std::string(e.what()));
  }
  const uint8_t* p = f->data();
  const auto h = formats::ObjectHeader::parse(f->bytes(), path);
  check_object_header(h, id, raw_size, path);
  const bool raw = h.stored;
  const uint64_t size = h.raw_size;
  const Digest want{h.digest_hi, h.digest_lo};
  if (raw && f->size() != kHeader + size) throw ObjectError(path + ": corrupt object (stored size differs)");
  if (raw) std::memcpy(dst, p + kHeader, size);
  size_t n = raw ? size : ZSTD_decompress(dst, size, p + kHeader, f->size() - kHeader);
  if (ZSTD_isError(n)) throw ObjectError(path + ": corrupt object (zstd: " + ZSTD_getErrorName(n) + ")");
  if (n != size) throw ObjectError(path + ": corrupt object (decompressed to " + std::to_string(n) + " bytes)");
  if (!(digest(std::span<const uint8_t>(dst, size)) == want)) throw ObjectError(path + ": corrupt object (checksum mismatch)");
}

std::vector<std::string> ObjectStore::repaired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return repaired_;
}

void ObjectStore::trust(std::set<std::string> ids) {
  std::lock_guard<std::mutex> lock(mutex_);
  trust_all_ = false;
  trusted_ = std::move(ids);
}

void ObjectStore::sync_dirs() {
  std::set<std::string> dirs;
  std::vector<std::string> files;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs.swap(touched_dirs_);
    files.swap(unsynced_);
  }
  // One batched pass: the kernel writes the objects back together instead of one fsync per put().
  std::atomic<bool> failed{false};
  std::string failed_path;
  std::mutex m;
  tbb::parallel_for(size_t{0}, files.size(), [&](size_t i) {
    int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fsync(fd) != 0) {
      std::lock_guard<std::mutex> lock(m);
      if (!failed.exchange(true)) failed_path = files[i] + ": fsync failed: " + std::strerror(errno);
    }
    if (fd >= 0) ::close(fd);
  });
  if (failed) throw Error(failed_path);
  for (const auto& d : dirs) fsync_dir(d);
  fsync_dir(dir_ + "/objects");
  fsync_dir(dir_);
}

std::vector<std::string> ObjectStore::list() const {
  std::vector<std::string> out;
  std::error_code ec;
  fs::path root = dir_ + "/objects";
  if (!fs::exists(root)) return out;
  for (const auto& sub : fs::directory_iterator(root, ec)) {
    if (!sub.is_directory()) continue;
    for (const auto& f : fs::directory_iterator(sub.path(), ec)) {
      std::string name = f.path().filename().string();
      if (name.size() == 32 && name.find('.') == std::string::npos) out.push_back(name);
    }
  }
  return out;
}

void ObjectStore::remove(const std::string& id) {
  std::error_code ec;
  fs::remove(path_of(id), ec);
}

size_t ObjectStore::remove_temporaries() {
  size_t n = 0;
  std::error_code ec;
  fs::path root = dir_ + "/objects";
  if (!fs::exists(root)) return 0;
  for (const auto& sub : fs::directory_iterator(root, ec)) {
    if (!sub.is_directory()) {
      if (sub.path().filename().string().find(".tmp.") != std::string::npos) {  // put_stream()'s
        fs::remove(sub.path(), ec);
        ++n;
      }
      continue;
    }
    for (const auto& f : fs::directory_iterator(sub.path(), ec))
      if (f.path().filename().string().find(".tmp.") != std::string::npos) {
        fs::remove(f.path(), ec);
        ++n;
      }
  }
  return n;
}

}  // namespace ucpkit::pec
