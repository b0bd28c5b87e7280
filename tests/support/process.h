// Tiny helpers shared by test binaries: run a shell command, make a scratch directory, bound a call's time.
#pragma once
#include <chrono>
#include <functional>
#include <string>

namespace ucpkit::testing {

// Runs `command` through the shell; returns its exit code (-1 when it could not run or was killed)
// and, when `output` is given, its stdout and stderr together (replacing what `output` held).
int run_command(const std::string& command, std::string* output = nullptr);

// As run_command, but returns the status the shell reports as $?: 128 + N when the command was killed
// by signal N (so a test can tell a crash, 139, from a refusal), -1 only when nothing could run.
int run_command_status(const std::string& command, std::string* output = nullptr);

// run_command_status with the command's stdout and stderr written to the file `log` (replaced).
int run_logged(const std::string& command, const std::string& log = "/dev/null");

// run_command's exit code and output together.
struct CommandResult {
  int rc;
  std::string out;
};
CommandResult run_capture(const std::string& command);

// A command's status (as run_command_status) with its stdout and stderr kept apart.
struct SplitResult {
  int rc;
  std::string out, err;
};
// Runs `command` with `cwd` as its working folder; stdout and stderr go through two files in `io_dir`
// (outside `cwd`, which may be a fixture), read back and removed.
SplitResult run_split_in(const std::string& cwd, const std::string& command, const std::string& io_dir);

// A fresh empty directory under the build tree (or /tmp) for one test; removed by nothing (debuggable).
std::string scratch_dir(const std::string& name);

// Runs `f`; if it has not returned after `limit`, prints `what` and ends the process (a hang is a
// failure, not something to wait for). Exceptions from `f` propagate.
void within(std::chrono::seconds limit, const std::string& what, const std::function<void()>& f);

// A forked child stopped (SIGKILL, reaped) when the guard goes, unless reaped() was called: a test that fails
// while its child waits at a pause must not leave it behind (it would hold ctest's output pipe open).
class ChildGuard {
 public:
  explicit ChildGuard(int pid) : pid_(pid) {}
  ~ChildGuard();
  ChildGuard(const ChildGuard&) = delete;
  ChildGuard& operator=(const ChildGuard&) = delete;
  void reaped() { pid_ = -1; }

 private:
  int pid_;
};

// Shell-quotes one argument.
std::string quote(const std::string& arg);

}  // namespace ucpkit::testing
