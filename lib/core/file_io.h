// File-descriptor helpers shared by every temp-then-rename writer and pread loop: an owning
// descriptor, and read/write loops that retry EINTR and short transfers and name the file on error.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ucpkit {

// Owns a file descriptor (-1 when none); closes it on destruction. Moves, never copies.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  // open(2) with O_CLOEXEC added; get() < 0 on failure (errno set), for callers that word their own error.
  UniqueFd(const std::string& path, int flags, mode_t mode = 0644);
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Opens `path` or throws Error "<path>: cannot open: <strerror>" ("cannot create" when flags has O_CREAT).
UniqueFd open_or_fail(const std::string& path, int flags, mode_t mode = 0644);

// Opens an input file read-only without blocking on it: O_NONBLOCK for the open (a FIFO with no
// writer, a device, would otherwise wait forever), then fstat, and anything but a regular file is
// refused before a byte is read: Error "<path>: <what> is a FIFO (named pipe), not a regular file"
// (`what`: "checkpoint file", "metadata file", ...). The descriptor returned blocks again for reads.
UniqueFd open_input(const std::string& path, const std::string& what = "input");

// Error text for a non-regular file type ("a FIFO (named pipe)", "a socket", "a directory", ...);
// empty for a regular file.
std::string special_file_kind(unsigned mode);

// write(2) / pwrite(2) until all `n` bytes are out; Error "<path>: write failed: <strerror>" otherwise.
void write_all(int fd, const void* data, size_t n, const std::string& path);
void pwrite_all(int fd, const void* data, size_t n, uint64_t offset, const std::string& path);

// pread(2) exactly `n` bytes at `offset`; Error "<path>: unexpected end of file" at EOF,
// "<path>: read failed: <strerror>" on error.
void pread_exact(int fd, void* dst, size_t n, uint64_t offset, const std::string& path);

// pread(2) retrying EINTR only: what it returns (a short count, 0 at EOF, -1 with errno).
ssize_t pread_some(int fd, void* dst, size_t n, uint64_t offset);

}  // namespace ucpkit
