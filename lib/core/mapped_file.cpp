// Memory-mapped files.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "core/file_io.h"

namespace ucpkit {
namespace {

// Live mappings, read by the SIGBUS handler (lock-free: plain atomics, fixed slots). A slot whose
// `end` is 0 is free. More live mappings than slots only means those are not guarded.
struct Slot {
  std::atomic<uintptr_t> begin{0}, end{0};
  std::atomic<const std::string*> path{nullptr};
};
constexpr int kSlots = 4096;
Slot g_slots[kSlots];
std::atomic<const std::string*> g_shrunk{nullptr};  // the first file found shrunken
struct sigaction g_previous {};

void forward_sigbus(int sig, siginfo_t* info, void* ctx) {
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) return g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    return g_previous.sa_handler(sig);
  }
  ::signal(SIGBUS, SIG_DFL);  // ends the process as before (a real fault and a raise() alike)
  ::raise(SIGBUS);
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  const auto addr = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
  for (Slot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire), e = s.end.load(std::memory_order_acquire);
    if (e == 0 || addr < b || addr >= e) continue;
    const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const uintptr_t from = addr / page * page;
    // Zero pages from the faulting page to the end of the mapping: later reads see zeros, not faults.
    if (::mmap(reinterpret_cast<void*>(from), e - from, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) ==
        MAP_FAILED) {
      static const char msg[] = "error: an input file shrank while it was read, and it could not be guarded\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(1);
    }
    const std::string* none = nullptr;
    g_shrunk.compare_exchange_strong(none, s.path.load());
    return;
  }
  forward_sigbus(sig, info, ctx);
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

// Returns the slot index, or -1 when every slot is taken.
int guard(const uint8_t* data, size_t size, const std::string* path) {
  install_sigbus_guard();
  for (int i = 0; i < kSlots; ++i) {
    uintptr_t free_end = 0;
    // Claim a free slot by its `end` first (0 -> 1 marks it taken before begin/path are set).
    if (!g_slots[i].end.compare_exchange_strong(free_end, 1)) continue;
    g_slots[i].path.store(path);
    g_slots[i].begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    g_slots[i].end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    return i;
  }
  return -1;
}

void unguard(int slot) {
  if (slot < 0) return;
  g_slots[slot].begin.store(0, std::memory_order_release);
  g_slots[slot].end.store(0, std::memory_order_release);
}

}  // namespace

void MappedFile::check_inputs_intact() {
  if (const std::string* p = g_shrunk.load())
    fail(*p, "the file shrank while it was read (rewritten or truncated by another process?); nothing was written");
}

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  UniqueFd file = open_input(path, "file");  // a FIFO or device is refused before it can block
  const int fd = file.get();
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) fail(path, std::string("cannot map: ") + std::strerror(errno));
    f->data_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
    f->slot_ = guard(f->data_, f->size_, &f->path_);
  }
  return f;
}

std::shared_ptr<const MappedFile> MappedFile::from_bytes(std::span<const uint8_t> bytes, std::string name) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->owned_.reset(new uint8_t[bytes.size() ? bytes.size() : 1]);
  if (!bytes.empty()) std::memcpy(f->owned_.get(), bytes.data(), bytes.size());
  f->data_ = f->owned_.get();
  f->size_ = bytes.size();
  f->path_ = std::move(name);
  return f;
}

std::shared_ptr<const MappedFile> MappedFile::slice(std::shared_ptr<const MappedFile> parent, size_t offset,
                                                   size_t length, std::string name, bool drop_when_released) {
  if (!parent || offset > parent->size() || length > parent->size() - offset)
    fail(name.empty() && parent ? parent->path() : name, "slice [" + std::to_string(offset) + ", +" +
                                                             std::to_string(length) + ") runs past the end of " +
                                                             (parent ? parent->path() : std::string("nothing")));
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->data_ = parent->data() + offset;
  f->size_ = length;
  f->parent_ = std::move(parent);
  f->path_ = std::move(name);
  f->drop_when_released_ = drop_when_released;
  return f;
}

MappedFile::~MappedFile() {
  if (drop_when_released_) {
    try {
      parent_->drop_pages(bytes());
    } catch (...) {  // only the pages stay resident
    }
  }
  if (!mapped_) return;
  // A path the handler recorded stays valid: a shrunken file's name outlives its mapping.
  if (g_shrunk.load() == &path_) g_shrunk.store(new std::string(path_));
  unguard(slot_);
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::done_with(std::span<const uint8_t> bytes) {
  const auto b = reinterpret_cast<uintptr_t>(bytes.data()), e = b + bytes.size();
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = (b + page - 1) / page * page, hi = e / page * page;
  if (bytes.empty() || hi <= lo) return;
  for (const Slot& s : g_slots) {  // only a live read-only file mapping: never memory the process owns
    const uintptr_t sb = s.begin.load(std::memory_order_acquire), se = s.end.load(std::memory_order_acquire);
    if (se <= 1 || b < sb || e > se) continue;
    ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
    return;
  }
}

void MappedFile::drop_pages(std::span<const uint8_t> bytes) const {
  if (parent_) return parent_->drop_pages(bytes);
  const auto b = reinterpret_cast<uintptr_t>(bytes.data()), e = b + bytes.size();
  const auto begin = reinterpret_cast<uintptr_t>(data_);
  if (!mapped_ || bytes.empty() || b < begin || e > begin + size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto drop = [&](uintptr_t lo, uintptr_t hi) {  // whole pages touched; the map's length is page-rounded
    lo = lo / page * page;
    hi = (hi + page - 1) / page * page;
    ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
  };
  std::unique_lock<std::mutex> lock(drop_mu_);
  if (drop_hi_ > drop_lo_ && (e + kDropBatch < drop_lo_ || b > drop_hi_ + kDropBatch)) {  // far away: the waiting go first
    const uintptr_t lo = drop_lo_, hi = drop_hi_;
    drop_lo_ = drop_hi_ = 0;
    drop(lo, hi);
  }
  drop_lo_ = drop_hi_ > drop_lo_ ? std::min(drop_lo_, b) : b;
  drop_hi_ = std::max(drop_hi_, e);
  if (drop_hi_ - drop_lo_ < kDropBatch) return;
  const uintptr_t lo = drop_lo_, hi = drop_hi_;
  drop_lo_ = drop_hi_ = 0;
  lock.unlock();
  drop(lo, hi);
}

void MappedFile::will_need(size_t offset, size_t length) const {
  if (!mapped_ || length == 0 || offset >= size_) return;
  long page = ::sysconf(_SC_PAGESIZE);
  size_t start = offset / page * page;
  size_t end = std::min(size_, offset + length);
  ::madvise(const_cast<uint8_t*>(data_) + start, end - start, MADV_WILLNEED);
}

void MappedFile::prefault(size_t offset, size_t length) const {
  if (!mapped_ || length == 0 || offset >= size_) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t start = offset / page * page, end = std::min(size_, offset + length);
#ifdef MADV_POPULATE_READ
  ::madvise(const_cast<uint8_t*>(data_) + start, end - start, MADV_POPULATE_READ);
#else
  ::madvise(const_cast<uint8_t*>(data_) + start, end - start, 22);
#endif
}

}  // namespace ucpkit
