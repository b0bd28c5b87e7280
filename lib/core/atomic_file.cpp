// Atomic file output.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"

namespace ucpkit {
namespace {
std::atomic<uint64_t> g_temp_counter{0};
constexpr size_t kBufferSize = 1 << 20;
// Cache::bypass: blocks of this size written with O_DIRECT, from memory aligned to kDirectAlign (the
// page size; every device block size in use divides it). A file system that wants a larger
// alignment answers EINVAL and the file is written through the cache instead.
constexpr size_t kDirectBlock = size_t{4} << 20;
constexpr size_t kDirectAlign = 4096;
// Full blocks waiting for the disk, at most (besides the one being filled). With one in flight, the disk of a 2.6-GB
// reshard was busy 1.96 s of its 2.4 s of writing: idle whenever the caller stalled.
constexpr size_t kQueuedBlocks = 3;
// Blocks past each file's second, for every file of the process together: a DCP writer keeps up to 16 data files
// bypassed at once, and those are written in parallel; each keeps at least its two blocks.
constexpr size_t kExtraBlocks = 8;
std::atomic<size_t> g_extra_blocks{0};

bool take_extra_block() {
  for (size_t n = g_extra_blocks.load(); n < kExtraBlocks;)
    if (g_extra_blocks.compare_exchange_weak(n, n + 1)) return true;
  return false;
}
}  // namespace

// Writes the full blocks queued, in order, with the file's O_DIRECT descriptor; stops at the first write that fails
// or is cut short off the alignment, leaving that block (and those after it) for settle() to write through the cache.
class AtomicFile::Writer {
 public:
  explicit Writer(int fd) : fd_(fd) {}
  ~Writer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = abandon_ = true;  // the file is being removed: the blocks queued are not written
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    for (char* b : queued_) std::free(b);
    for (char* b : free_) std::free(b);
    if (allocated_ > 1) g_extra_blocks -= allocated_ - 1;
  }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Queues `block` (full); returns a block to fill next, nullptr once a write has failed (settle() then).
  char* submit(char* block) {
    std::unique_lock<std::mutex> lock(mu_);
    queued_.push_back(block);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    cv_.notify_all();
    if (failed_) return nullptr;
    if (free_.empty() && allocated_ < kQueuedBlocks && (allocated_ == 0 || take_extra_block())) {
      void* b = nullptr;
      if (::posix_memalign(&b, kDirectAlign, kDirectBlock) == 0) {
        ++allocated_;
        return static_cast<char*>(b);
      }  // no memory for another: the next one written is reused
      if (allocated_ > 0) --g_extra_blocks;
    }
    cv_.wait(lock, [&] { return !free_.empty() || failed_; });
    if (failed_) return nullptr;
    char* b = free_.back();
    free_.pop_back();
    return b;
  }

  struct Left {
    std::vector<char*> blocks;  // not written direct, in file order (the caller frees them)
    size_t written = 0;         // bytes of the first that were
    int error = 0;              // the failed write's errno (0: cut short, or none)
  };
  // Waits for the queue to be written (or a write to fail) and ends the thread.
  Left drain() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    Left left{std::vector<char*>(queued_.begin(), queued_.end()), written_, error_};
    queued_.clear();
    return left;
  }

 private:
  void run() {
    for (;;) {
      char* block;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queued_.empty(); });
        if (abandon_ || queued_.empty()) return;
        block = queued_.front();  // stays queued until written
      }
      size_t written = 0;
      int error = 0;
      bool ok = true;
      while (written < kDirectBlock) {
        const ssize_t w = ::write(fd_, block + written, kDirectBlock - written);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0 || static_cast<size_t>(w) % kDirectAlign != 0) {
          error = w < 0 ? errno : w == 0 ? EIO : 0;
          if (w > 0) written += static_cast<size_t>(w);
          ok = false;
          break;
        }
        written += static_cast<size_t>(w);
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        failed_ = true;
        written_ = written;
        error_ = error;
        cv_.notify_all();
        return;
      }
      queued_.pop_front();
      free_.push_back(block);
      cv_.notify_all();
    }
  }

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<char*> queued_;  // full blocks in file order; the front one is being written
  std::vector<char*> free_;   // written, to fill again
  size_t allocated_ = 0;      // blocks of this writer's own (the caller's first one aside); past the first, extra
  bool stop_ = false, abandon_ = false, failed_ = false;
  size_t written_ = 0;  // of the failed block
  int error_ = 0;
  std::thread thread_;
};

AtomicFile::AtomicFile(std::string target, bool durable, Cache cache) : target_(std::move(target)), durable_(durable) {
  temp_ = target_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_temp_counter++);
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(target_, std::string("cannot create: ") + std::strerror(errno));
  if (cache == Cache::bypass) {
    const int flags = ::fcntl(fd_, F_GETFL);
    void* block = nullptr;
    if (flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0) {
      if (::posix_memalign(&block, kDirectAlign, kDirectBlock) == 0)
        direct_ = static_cast<char*>(block);
      else
        ::fcntl(fd_, F_SETFL, flags);
    }
  }
  if (!direct_) buffer_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
  writer_.reset();
  std::free(direct_);
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

bool AtomicFile::direct_block() {
  size_t done = 0;
  while (done < direct_used_) {
    const ssize_t w = ::write(fd_, direct_ + done, direct_used_ - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EINVAL && done == 0) return false;  // O_DIRECT refused here: through the cache
    if (w <= 0 || static_cast<size_t>(w) % kDirectAlign != 0) {
      if (w < 0) fail(target_, std::string("write failed: ") + std::strerror(errno));
      // A short write off the alignment: the rest through the cache (leave_direct writes it).
      std::memmove(direct_, direct_ + done + static_cast<size_t>(w), direct_used_ - done - static_cast<size_t>(w));
      direct_used_ -= done + static_cast<size_t>(w);
      return false;
    }
    done += static_cast<size_t>(w);
  }
  direct_used_ = 0;
  return true;
}

void AtomicFile::direct_off() {
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0)
    fail(target_, std::string("cannot turn O_DIRECT off: ") + std::strerror(errno));
}

void AtomicFile::submit_block() {
  if (!writer_) writer_ = std::make_unique<Writer>(fd_);
  direct_ = writer_->submit(direct_);
  direct_used_ = 0;
  if (!direct_) settle();  // a write failed or was cut short: the rest through the cache
}

void AtomicFile::settle() {
  if (!writer_) return;
  Writer::Left left = writer_->drain();
  writer_.reset();
  struct Free {  // the blocks not written direct, freed however this ends
    std::vector<char*>& blocks;
    ~Free() {
      for (char* b : blocks) std::free(b);
    }
  } free_left{left.blocks};
  if (left.blocks.empty()) return;
  // O_DIRECT refused (EINVAL before any byte) or a write cut short off the alignment: that block's rest, the blocks
  // queued after it, then the block being filled, through the cache from here on.
  if (left.error && !(left.error == EINVAL && left.written == 0))
    fail(target_, std::string("write failed: ") + std::strerror(left.error));
  direct_off();
  for (size_t i = 0; i < left.blocks.size(); ++i) {
    const size_t from = i == 0 ? left.written : 0;
    write_all(fd_, left.blocks[i] + from, kDirectBlock - from, target_);
  }
  if (direct_) {
    write_all(fd_, direct_, direct_used_, target_);
    std::free(direct_);
    direct_ = nullptr;
    direct_used_ = 0;
  }
}

void AtomicFile::leave_direct() {
  settle();
  if (!direct_) return;
  // The whole blocks of what is buffered still go direct (offsets and sizes stay aligned), the tail
  // through the cache with O_DIRECT off.
  const size_t whole = direct_used_ / kDirectAlign * kDirectAlign, tail = direct_used_ - whole;
  bool direct_ok = true;
  if (whole > 0) {
    direct_used_ = whole;
    direct_ok = direct_block();
  }
  direct_off();
  if (!direct_ok) write_all(fd_, direct_, direct_used_, target_);  // refused or cut short: what is left
  write_all(fd_, direct_ + whole, tail, target_);
  std::free(direct_);
  direct_ = nullptr;
  direct_used_ = 0;
}

void AtomicFile::write_direct(const char* data, size_t n) {
  while (n > 0) {
    const size_t k = std::min(n, kDirectBlock - direct_used_);
    std::memcpy(direct_ + direct_used_, data, k);
    direct_used_ += k;
    data += k;
    n -= k;
    if (direct_used_ == kDirectBlock) {
      submit_block();
      if (!direct_) {
        write_all(fd_, data, n, target_);  // the rest through the cache (offset_ counted it already)
        return;
      }
    }
  }
}

void AtomicFile::flush_buffer() {
  leave_direct();
  write_all(fd_, buffer_.data(), buffer_.size(), target_);
  buffer_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  if (n == 0) return;
  offset_ += n;
  if (direct_) return write_direct(static_cast<const char*>(data), n);
  if (buffer_.empty() && n >= kBufferSize / 2) {  // large writes go straight to the file (no copy)
    write_all(fd_, static_cast<const char*>(data), n, target_);
    return;
  }
  if (buffer_.size() + n <= kBufferSize) {
    buffer_.append(static_cast<const char*>(data), n);
    return;
  }
  flush_buffer();
  if (n < kBufferSize) {
    buffer_.append(static_cast<const char*>(data), n);
    return;
  }
  write_all(fd_, static_cast<const char*>(data), n, target_);
}

std::span<uint8_t> AtomicFile::room(size_t want, size_t align) {
  if (!direct_ || want == 0) return {};
  const size_t left = kDirectBlock - direct_used_;  // never 0: a full block is written at once
  if (want < left) return {reinterpret_cast<uint8_t*>(direct_ + direct_used_), want};
  if (align > 1 && left % align != 0) return {};
  return {reinterpret_cast<uint8_t*>(direct_ + direct_used_), left};
}

void AtomicFile::filled(size_t n) {
  offset_ += n;
  direct_used_ += n;
  if (direct_used_ == kDirectBlock) submit_block();
}

void AtomicFile::write_zeros(size_t n) {
  static const char zeros[4096] = {};
  while (n > 0) {
    size_t k = std::min(n, sizeof(zeros));
    write(zeros, k);
    n -= k;
  }
}

void AtomicFile::flush(bool keep_buffer) {
  flush_buffer();
  if (!keep_buffer) std::string().swap(buffer_);
}

void AtomicFile::skip(uint64_t n) {
  if (n == 0) return;
  flush_buffer();
  if (::lseek(fd_, static_cast<off_t>(n), SEEK_CUR) < 0) fail(target_, std::string("seek failed: ") + std::strerror(errno));
  offset_ += n;
  // A hole at the very end would not extend the file; the next write or commit() does.
  if (::ftruncate(fd_, static_cast<off_t>(offset_)) != 0)
    fail(target_, std::string("cannot extend: ") + std::strerror(errno));
}

void AtomicFile::pwrite_at(uint64_t offset, std::span<const uint8_t> bytes) {
  if (offset > offset_ || bytes.size() > offset_ - offset)
    fail(target_, "pwrite_at: bytes [" + std::to_string(offset) + ", +" + std::to_string(bytes.size()) +
                      ") were not written yet");
  // Inside the direct block being filled (a zip record's CRC after its data): patched there, O_DIRECT kept.
  if (direct_ && offset >= offset_ - direct_used_) {
    if (!bytes.empty()) std::memcpy(direct_ + (offset - (offset_ - direct_used_)), bytes.data(), bytes.size());
    return;
  }
  leave_direct();
  // Bytes still in the buffer are patched there, the rest in the file.
  const uint64_t buffered_from = offset_ - buffer_.size();
  size_t in_file = 0;
  if (offset < buffered_from) in_file = static_cast<size_t>(std::min<uint64_t>(bytes.size(), buffered_from - offset));
  pwrite_all(fd_, bytes.data(), in_file, offset, target_);
  if (in_file < bytes.size())
    std::memcpy(buffer_.data() + (offset + in_file - buffered_from), bytes.data() + in_file, bytes.size() - in_file);
}

void AtomicFile::start_writeback() {
  flush_buffer();
  ::sync_file_range(fd_, 0, 0, SYNC_FILE_RANGE_WRITE);  // a hint: its failure changes nothing
}

void AtomicFile::commit_as(std::string target) {
  target_ = std::move(target);
  commit();
}

void AtomicFile::commit() {
  MappedFile::check_inputs_intact();  // nothing read from an input that shrank under us is committed
  flush_buffer();
  if (durable_ && ::fsync(fd_) != 0) fail(target_, std::string("fsync failed: ") + std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail(target_, std::string("close failed: ") + std::strerror(errno));
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    fail(target_, std::string("cannot rename into place: ") + std::strerror(errno));
  committed_ = true;
  if (durable_) fsync_dir(std::filesystem::path(target_).parent_path().string());
}

void write_file_atomic(const std::string& path, std::string_view contents, bool durable, AtomicFile::Cache cache) {
  AtomicFile f(path, durable, cache);
  f.write(contents.data(), contents.size());
  f.commit();
}

void check_file_target(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw Error(path + ": folder " + dir.string() +
                (std::filesystem::exists(dir, ec) ? " is not a folder" : " does not exist (create it first)"));
  if (::access(dir.c_str(), W_OK) != 0) throw Error(path + ": folder " + dir.string() + " is not writable");
  if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a folder, not a file");
}

std::string read_text_file(const std::string& path, const std::string& what) {
  const UniqueFd in = open_input(path, what);
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = pread_some(in.get(), buf, sizeof buf, out.size());
    if (n < 0) fail(path, std::string("read failed: ") + std::strerror(errno));
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
}

void copy_file_contents(const std::string& from, const std::string& to) {
  const int in = open_input(from).release();
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    const int err = errno;
    ::close(in);
    fail(to, std::string("cannot create: ") + std::strerror(err));
  }
  auto give_up = [&](const char* what, int err) {
    ::close(in);
    ::close(out);
    fail(to, std::string(what) + " (copying " + from + "): " + std::strerror(err));
  };
  bool plain = false;  // copy_file_range unsupported here (another file system, a device): read/write
  std::string buf;
  for (;;) {
    if (!plain) {
      const ssize_t n = ::copy_file_range(in, nullptr, out, nullptr, 1 << 30, 0);
      if (n > 0) continue;
      if (n == 0) break;
      if (errno == EINTR) continue;
      if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) give_up("write failed", errno);
      plain = true;
      buf.resize(kBufferSize);
    }
    const ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      give_up("read failed", errno);
    }
    if (n == 0) break;
    write_all(out, buf.data(), static_cast<size_t>(n), to);
  }
  ::close(in);
  if (::close(out) != 0) fail(to, std::string("close failed: ") + std::strerror(errno));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace ucpkit
