// Test helpers: processes, scratch directories, time limits.
#include "support/process.h"

#include "support/files.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <string>

namespace ucpkit::testing {

int run_command(const std::string& command, std::string* output) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return -1;
  std::array<char, 4096> buf{};
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) text.append(buf.data(), n);
  int status = pclose(p);
  if (output) *output = std::move(text);
  if (status == -1 || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int run_command_status(const std::string& command, std::string* output) {
  std::string text;
  if (run_command("( " + command + " ) 2>&1; echo \"rc=$?\"", &text) != 0) return -1;
  const size_t at = text.rfind("rc=");
  if (at == std::string::npos) return -1;
  const int rc = std::stoi(text.substr(at + 3));
  if (output) *output = text.substr(0, at);
  return rc;
}

int run_logged(const std::string& command, const std::string& log) {
  return run_command_status(command + " >" + quote(log) + " 2>&1");
}

CommandResult run_capture(const std::string& command) {
  CommandResult r{0, ""};
  r.rc = run_command(command, &r.out);
  return r;
}

SplitResult run_split_in(const std::string& cwd, const std::string& command, const std::string& io_dir) {
  // Names of this process and call: ctest runs tests in parallel, and some share an io folder (a
  // scratch root); fixed names let one test read or remove another's stderr.
  static std::atomic<unsigned> calls{0};
  const std::string tag = std::to_string(getpid()) + "." + std::to_string(calls++);
  const std::string out = io_dir + "/stdout." + tag, err = io_dir + "/stderr." + tag;
  SplitResult r{run_command_status("cd " + quote(cwd) + " && " + command + " >" + quote(out) + " 2>" + quote(err)), "", ""};
  r.out = file_bytes(out);
  r.err = file_bytes(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

std::string scratch_dir(const std::string& name) {
#ifdef UCPKIT_BUILD_DIR
  std::filesystem::path root = std::filesystem::path(UCPKIT_BUILD_DIR) / "test-scratch";
#else
  std::filesystem::path root = std::filesystem::temp_directory_path() / "ucpkit-test-scratch";
#endif
  std::filesystem::path dir = root / (name + "." + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void within(std::chrono::seconds limit, const std::string& what, const std::function<void()>& f) {
  auto fut = std::async(std::launch::async, f);
  if (fut.wait_for(limit) == std::future_status::timeout) {
    std::cerr << "TIMEOUT: " << what << " did not finish within " << limit.count() << " s" << std::endl;
    std::_Exit(3);
  }
  fut.get();
}

std::string quote(const std::string& arg) {
  std::string r = "'";
  for (char c : arg) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

ChildGuard::~ChildGuard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
}

}  // namespace ucpkit::testing
