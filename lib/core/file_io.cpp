#include "core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ucpkit {

UniqueFd::UniqueFd(const std::string& path, int flags, mode_t mode) : fd_(::open(path.c_str(), flags | O_CLOEXEC, mode)) {}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

UniqueFd open_or_fail(const std::string& path, int flags, mode_t mode) {
  UniqueFd f(path, flags, mode);
  if (!f) fail(path, std::string((flags & O_CREAT) ? "cannot create: " : "cannot open: ") + std::strerror(errno));
  return f;
}

std::string special_file_kind(unsigned mode) {
  if (S_ISREG(mode)) return {};
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

namespace {
// Test hook: with UCPKIT_TEST_STALL_READ=<text>, opening an input whose path contains <text> stalls for
// two minutes without looking at any flag, as a read blocked in the kernel on a stalled network file
// system does; the tests check that SIGTERM still ends every tool within 2 s (core/staging.h).
void stall_if_asked(const std::string& path) {
  const char* v = std::getenv("UCPKIT_TEST_STALL_READ");
  if (!v || !*v || path.find(v) == std::string::npos) return;
  for (int i = 0; i < 12000; ++i) ::usleep(10000);
}
}  // namespace

UniqueFd open_input(const std::string& path, const std::string& what) {
  stall_if_asked(path);
  UniqueFd f(path, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (!f) fail(path, "cannot read " + what + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) fail(path, "cannot stat " + what + ": " + std::strerror(errno));
  if (const std::string kind = special_file_kind(st.st_mode); !kind.empty())
    fail(path, "the " + what + " is " + kind + ", not a regular file; nothing was read from it");
  const int flags = ::fcntl(f.get(), F_GETFL);
  if (flags < 0 || ::fcntl(f.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    fail(path, "cannot set up reading " + what + ": " + std::strerror(errno));
  return f;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, std::string("write failed: ") + std::strerror(errno));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(path, std::string("write failed: ") + std::strerror(errno));
    }
    if (w == 0) fail(path, "write failed: no progress");
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

ssize_t pread_some(int fd, void* dst, size_t n, uint64_t offset) {
  for (;;) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (r >= 0 || errno != EINTR) return r;
  }
}

void pread_exact(int fd, void* dst, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = pread_some(fd, p, n, offset);
    if (r <= 0) fail(path, r == 0 ? "unexpected end of file" : std::string("read failed: ") + std::strerror(errno));
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

}  // namespace ucpkit
