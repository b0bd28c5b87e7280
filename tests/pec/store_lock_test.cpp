// Issue 32 (WEAK, messages): a pec-restore reading a store holds its lock shared. A pec-save that found
// the lock taken said "another pec-save holds this store", and `pec-save --watch` logged the step as
// NOT saved and never tried it again (the step was lost for the store). Now the message says a reader
// holds it, with its process id and name, and --watch tries the step again at the next poll.
//
// The reader here is this test process holding the lock shared (flock, as pec-restore does); the tools
// run as a job script runs them: from the job's folder, with relative paths.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"
#include "job.h"

namespace store_lock_test {

namespace fs = std::filesystem;
using namespace ucpkit::testing;

namespace {

std::string save(const std::string& ck, int64_t step) {
  return kBin + "/pec-save -q --checkpoint " + ck + " --store store --step " + std::to_string(step) +
         " --policy sequential --k 1";
}

// The store's lock held shared by this process, as a pec-restore holds it while it reads.
struct ReaderLock {
  explicit ReaderLock(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    EXPECT_GE(fd, 0) << path;
    EXPECT_EQ(::flock(fd, LOCK_SH | LOCK_NB), 0) << path;
  }
  void release() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  ~ReaderLock() { release(); }
  int fd;
};
}  // namespace

TEST(PecStoreLock, ASaveNamesTheRestoreHoldingTheStore) {
  PecJob job("pec_lock_named", {100, 200});
  ASSERT_EQ(job.run(save("ck100", 100)).rc, 0);
  ReaderLock reader(job.dir + "/store/.lock");
  const SplitResult r = job.run(save("ck200", 200));
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.find("another pec-save"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("reader (pec-restore)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pid " + std::to_string(::getpid())), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  reader.release();
  EXPECT_EQ(job.run(save("ck200", 200)).rc, 0);
}

TEST(PecStoreLock, WatchTriesTheStepAgainOnceTheRestoreEnds) {
  PecJob job("pec_lock_watch", {100, 200});
  ASSERT_EQ(job.run(save("ck100", 100)).rc, 0);
  ReaderLock reader(job.dir + "/store/.lock");
  const std::string log = job.dir + "/io/watch.log";
  const std::string cmd = "cd " + job.dir + " && exec " + kBin +
                          "/pec-save --watch ck200 --store store --policy sequential --k 1 --poll-seconds 0.1 >io/watch.log 2>&1";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // The first line about step 200 (the harness' timeout bounds this wait).
  auto lines_about = [&](const std::string& what) {
    const std::string text = file_bytes(log);
    return text.find(what) != std::string::npos;
  };
  int status = 0;
  bool ended = false;  // the watch ended on its own (it must not: the test fails below)
  auto wait_for = [&](const std::string& what) {
    while (!lines_about(what) && !ended) {
      ended = ::waitpid(pid, &status, WNOHANG) == pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  wait_for("step 200");
  ASSERT_FALSE(ended) << file_bytes(log);
  const std::string first = file_bytes(log);
  EXPECT_EQ(first.find("NOT saved"), std::string::npos) << first;
  EXPECT_NE(first.find("not saved yet"), std::string::npos) << first;
  EXPECT_NE(first.find("pid " + std::to_string(::getpid())), std::string::npos) << first;
  if (first.find("NOT saved") == std::string::npos) {
    reader.release();
    wait_for("step 200 saved");
  }
  ASSERT_FALSE(ended) << file_bytes(log);
  ::kill(pid, SIGTERM);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << file_bytes(log);
  EXPECT_EQ(WEXITSTATUS(status), 0) << file_bytes(log);  // no step NOT saved
  EXPECT_TRUE(fs::exists(job.dir + "/store/manifests/step-000000000200.json")) << file_bytes(log);
}

}  // namespace store_lock_test
