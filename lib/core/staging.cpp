// Staged output folders and the SIGINT/SIGTERM handling that lets a run remove its own.
#include "core/staging.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"

namespace fs = std::filesystem;

namespace ucpkit {

namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_staged{0};      // > 0 while this process writes into a staging folder
std::atomic<int> g_committing{0};  // > 0 while a commit flushes and renames (it must not be cut short)
int g_wake[2] = {-1, -1};          // the signal handler's byte to the stop watchdog

// Folders the stop watchdog removes before it ends the process (staging folders, scratch copies).
std::mutex g_removed_mu;
std::vector<fs::path>& removed_on_stop() {
  static std::vector<fs::path> paths;
  return paths;
}

extern "C" void on_stop_signal(int sig) {
  if (g_staged.load() == 0) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_signal.store(sig);
  const int saved = errno;
  const char c = 1;
  if (g_wake[1] >= 0) (void)!::write(g_wake[1], &c, 1);
  errno = saved;
}

// How long a stopped run may take to reach its next check_interrupted() before the watchdog ends it.
std::chrono::milliseconds stop_grace() {
  if (const char* v = std::getenv("UCPKIT_STOP_GRACE_MS"); v && *v) return std::chrono::milliseconds(std::atol(v));
  return std::chrono::milliseconds(800);
}

// The signal flag is enough while the workers reach check_interrupted() between jobs; a thread blocked
// in a read (a stalled network file system, a device) never does, and SA_RESTART resumes the read. So a
// thread of its own waits for the handler's byte, gives the run stop_grace() to unwind on its own, then
// removes the registered folders and ends the process by the signal (a commit in progress finishes first).
void stop_watchdog() {
  for (;;) {
    char c;
    const ssize_t n = ::read(g_wake[0], &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const auto deadline = std::chrono::steady_clock::now() + stop_grace();
    while (std::chrono::steady_clock::now() < deadline || g_committing.load() > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int sig = g_signal.load();
    if (sig == 0) continue;  // a commit completed: the run ends as it did (exit 0)
    {
      std::lock_guard lock(g_removed_mu);
      std::error_code ec;
      for (const auto& p : removed_on_stop()) fs::remove_all(p, ec);
    }
    ::signal(sig, SIG_DFL);
    ::kill(::getpid(), sig);
    ::_exit(128 + sig);
  }
}

void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_wake, O_CLOEXEC) == 0) std::thread(stop_watchdog).detach();
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int sig : {SIGINT, SIGTERM}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;  // stays ignored (nohup)
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

// ".<name>.<tag>-": what every staging name of `target` starts with.
std::string staging_prefix(const fs::path& target, const std::string& tag) {
  std::string s(".");
  s += target.filename().string();
  s += '.';
  s += tag;
  s += '-';
  return s;
}

// The output folder as an absolute path without a trailing slash: "out/", "./out" and "out" are one
// folder (a trailing slash made the folder its own parent).
fs::path folder_path(const fs::path& p) {
  fs::path a = fs::absolute(p).lexically_normal();
  if (!a.has_filename()) a = a.parent_path();
  return a;
}

// `.<name>.<tag>-<kind>-<pid>` beside `target`, for this process.
fs::path sibling(const fs::path& target, const std::string& tag, const char* kind) {
  return target.parent_path() / (staging_prefix(target, tag) + kind + "-" + std::to_string(getpid()));
}

}  // namespace

RemovedOnStop::RemovedOnStop(fs::path path) : path_(std::move(path)) {
  std::lock_guard lock(g_removed_mu);
  removed_on_stop().push_back(path_);
}

OwnedFolder::OwnedFolder(fs::path path) : path_(std::move(path)), removed_(path_) {}

OwnedFolder::~OwnedFolder() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

RemovedOnStop::~RemovedOnStop() {
  std::lock_guard lock(g_removed_mu);
  auto& v = removed_on_stop();
  for (auto it = v.begin(); it != v.end(); ++it)
    if (*it == path_) {
      v.erase(it);
      break;
    }
}

StagedPhase::StagedPhase() {
  install_stop_handlers();
  ++g_staged;
}

StagedPhase::~StagedPhase() { --g_staged; }

void check_interrupted() {
  if (int sig = g_signal.load())
    throw Error(std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM") +
                "; the unfinished output was removed");
}

int interrupted_signal() { return g_signal.load(); }

void raise_if_interrupted() {
  if (int sig = interrupted_signal()) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

void test_pause_if_asked() {
  const char* v = std::getenv("UCPKIT_TEST_PAUSE_STAGED");
  if (!v || !*v) return;
  const std::string go = v;
  while (g_signal.load() == 0) {
    if (go != "1" && ::access(go.c_str(), F_OK) == 0) return;
    ::usleep(10000);
  }
}

void test_pause_in_commit_if_asked() {
  const char* v = std::getenv("UCPKIT_TEST_PAUSE_IN_COMMIT");
  if (!v || !*v) return;
  const std::string go = v;
  { std::ofstream(go + ".reached") << ::getpid() << "\n"; }
  while (::access(go.c_str(), F_OK) != 0) ::usleep(10000);  // signals only set the flag meanwhile
}

void sync_file_system(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path.string() + ": cannot open to flush to stable storage: " + std::strerror(errno));
  const int rc = ::syncfs(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error(path.string() + ": flushing to stable storage failed: " + std::strerror(err));
}

namespace {
// A process is gone when kill(pid, 0) fails with ESRCH, or when it is a zombie (dead, not reaped yet:
// the ranks of an mpirun killed with SIGKILL are orphans that a container's init may never reap).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) == 0 || errno != ESRCH) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
    FILE* f = std::fopen(path, "re");
    if (!f) return false;  // alive (or not ours to probe): keep
    char buf[512];
    const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    buf[n] = 0;
    const char* close = std::strrchr(buf, ')');  // "pid (comm) S ...": comm may hold spaces and ')'
    return close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
  }
  return true;
}
}  // namespace

void sweep_stale_staging(const fs::path& target, const std::string& tag, const StagingNote& note) {
  const std::string prefix = staging_prefix(target, tag);
  std::error_code ec;
  for (fs::directory_iterator it(target.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const bool tmp = rest.compare(0, 4, "tmp-") == 0, old = rest.compare(0, 4, "old-") == 0;
    if (!tmp && !old) continue;
    const std::string digits = rest.substr(4);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (!process_gone(pid)) continue;  // alive (or not ours to probe): keep
    std::error_code e2;
    if (old && !fs::exists(target, e2)) continue;  // the only copy of the previous output
    fs::remove_all(it->path(), e2);
    if (note) note("removed stale staging folder " + it->path().string() + " (process " + digits + " is gone)");
  }
}

namespace {
bool (*g_checkpoint_entry)(const std::string& name) = nullptr;  // set by lib/formats (formats/looked_for.cpp)
}  // namespace

void set_checkpoint_entry_test(bool (*test)(const std::string& name)) { g_checkpoint_entry = test; }

std::string not_replaceable(const fs::path& target) {
  std::error_code ec;
  const auto st = fs::status(target, ec);  // a link to a folder is judged by the folder
  if (ec || !fs::exists(st)) return {};
  if (!fs::is_directory(st)) return "is not a folder";
  std::vector<std::string> other;
  size_t entries = 0;
  for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec)) {
    ++entries;
    const std::string n = it->path().filename().string();
    if (g_checkpoint_entry && g_checkpoint_entry(n)) return {};
    if (other.size() < 3) other.push_back(n);
  }
  if (ec) return "cannot be listed (" + ec.message() + ")";
  if (entries == 0) return {};
  std::string list;
  for (const auto& n : other) list += (list.empty() ? "" : ", ") + escaped_brief(n, 60);
  return "holds no checkpoint (" + std::to_string(entries) + " entr" + (entries == 1 ? "y" : "ies") + ": " + list +
         (entries > other.size() ? ", ..." : "") + ")";
}

void sweep_stale_pid_folders(const fs::path& dir, const std::string& prefix, const StagingNote& note) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    size_t e = prefix.size();
    while (e < name.size() && e - prefix.size() < 10 && std::isdigit(static_cast<unsigned char>(name[e]))) ++e;
    if (e == prefix.size() || e - prefix.size() > 9) continue;
    if (e < name.size() && std::isdigit(static_cast<unsigned char>(name[e]))) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name.substr(prefix.size(), e - prefix.size())));
    if (pid <= 0 || pid == ::getpid() || !process_gone(pid)) continue;
    std::error_code e2;
    fs::remove_all(it->path(), e2);
    if (note) note("removed stale scratch folder " + it->path().string() + " (process " + std::to_string(pid) + " is gone)");
  }
}

void check_output_target(const fs::path& target, bool overwrite, const std::string& overwrite_option) {
  const fs::path t = folder_path(target);
  std::error_code ec;
  if (fs::exists(t, ec) && !overwrite)
    throw Error(t.string() + ": output already exists (remove it or pass " + overwrite_option + ")");
  if (overwrite)
    if (const std::string why = not_replaceable(t); !why.empty())
      throw Error(t.string() + ": " + overwrite_option + " replaces an empty folder or a checkpoint; this " + why +
                  ": remove it yourself or choose another output");
  const fs::path parent = t.parent_path();
  if (!fs::is_directory(parent, ec)) throw Error(parent.string() + ": output parent folder does not exist");
}

StagingDir::StagingDir(const fs::path& target, bool overwrite, std::string tag, const StagingNote& note,
                       bool durable, std::string overwrite_option)
    : target_(folder_path(target)),
      tag_(std::move(tag)),
      overwrite_option_(std::move(overwrite_option)),
      note_(note),
      overwrite_(overwrite),
      durable_(durable) {
  check_output_target(target_, overwrite, overwrite_option_);
  std::error_code ec;
  path_ = sibling(target_, tag_, "tmp");
  removed_ = std::make_unique<RemovedOnStop>(path_);
  sweep_stale_staging(target_, tag_, note);
  fs::remove_all(path_, ec);
  if (!fs::create_directory(path_, ec) || ec)
    throw Error(target_.string() + ": cannot create output: " + (ec ? ec.message() : std::string("failed")));
}

StagingDir::~StagingDir() {
  if (committed_) return;
  // Under MPI the other ranks may still be removing their own temporary files in this folder while
  // this rank removes it; an entry vanishing under remove_all can make it stop early, so try again.
  std::error_code ec;
  for (int attempt = 0; attempt < 20; ++attempt) {
    fs::remove_all(path_, ec);
    if (!fs::exists(path_, ec)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void StagingDir::sync() const {
  if (durable_) sync_file_system(path_);
}

void StagingDir::commit() {
  check_interrupted();  // a signal that came before the commit stops the run: nothing is committed
  ++g_committing;
  struct Done {
    ~Done() { --g_committing; }
  } done;
  MappedFile::check_inputs_intact();  // nothing read from an input that shrank under us is committed
  // Again at the end: the processes of a run killed just before this one started (the orphaned ranks
  // of a SIGKILLed mpirun) may have still been alive then; their folders would stay until a next run.
  sweep_stale_staging(target_, tag_, note_);
  sync();
  test_pause_in_commit_if_asked();
  std::error_code ec;
  if (!overwrite_) {
    // Rename without replacing: a target that appeared during the run (a concurrent run, a user's
    // folder) stays, and this run fails instead of deleting it.
    if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target_.c_str(), RENAME_NOREPLACE) != 0) {
      const int err = errno;
      if (err == EEXIST || err == ENOTEMPTY)
        throw Error(target_.string() + ": output appeared while this run was writing it (another run?); kept it, "
                    "nothing written (pass " + overwrite_option_ + " to replace it)");
      if (err != EINVAL && err != ENOSYS) throw Error(target_.string() + ": cannot rename output into place: " + std::strerror(err));
      // A file system without RENAME_NOREPLACE: check, then rename (a narrow race remains).
      if (fs::exists(target_, ec))
        throw Error(target_.string() + ": output appeared while this run was writing it (another run?); kept it, "
                    "nothing written (pass " + overwrite_option_ + " to replace it)");
      fs::rename(path_, target_, ec);
      if (ec) throw Error(target_.string() + ": cannot rename output into place: " + ec.message());
    }
    committed_ = true;
  } else if (fs::exists(target_, ec) &&
             ::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;  // the old output now lives at path_: remove it
    fs::remove_all(path_, ec);
  } else {
    fs::path old;
    if (fs::exists(target_, ec)) {
      old = sibling(target_, tag_, "old");
      fs::rename(target_, old, ec);
      if (ec) throw Error(target_.string() + ": cannot replace: " + ec.message());
    }
    fs::rename(path_, target_, ec);
    if (ec) throw Error(target_.string() + ": cannot rename output into place: " + ec.message());
    committed_ = true;
    if (!old.empty()) fs::remove_all(old, ec);
  }
  removed_.reset();
  fsync_dir(target_.parent_path().string());
  // The output is complete and on stable storage: a SIGINT/SIGTERM that came during the flush or the
  // rename no longer stops anything, and the run ends as its commit did (exit 0), not by the signal
  // (130/143 with the output complete).
  g_signal.store(0);
}

}  // namespace ucpkit
