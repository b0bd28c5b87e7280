// Atomic file output.
#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "core/mapped_file.h"

namespace ucpkit {
namespace {
std::atomic<uint64_t> g_temp_counter{0};
constexpr size_t kBufferSize = 1 << 20;
}  // namespace

AtomicFile::AtomicFile(std::string target, bool durable) : target_(std::move(target)), durable_(durable) {
  temp_ = target_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_temp_counter++);
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(target_, std::string("cannot create: ") + std::strerror(errno));
  buffer_.reserve(kBufferSize);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::flush_buffer() {
  write_all(fd_, buffer_.data(), buffer_.size(), target_);
  buffer_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  if (n == 0) return;
  offset_ += n;
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

void write_file_atomic(const std::string& path, std::string_view contents, bool durable) {
  AtomicFile f(path, durable);
  f.write(contents.data(), contents.size());
  f.commit();
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void copy_file_contents(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) fail(from, std::string("cannot open: ") + std::strerror(errno));
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
