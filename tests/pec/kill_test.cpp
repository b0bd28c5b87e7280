// kill -9 of the persist agent (`pec-save --watch`) at random points of its save loop: a fake trainer
// writes three steps into the watched folder (the step folder first, `latest` last, as DeepSpeed does)
// and the agent is SIGKILLed at a crash point drawn at random (seeded, so every run draws the same
// points) among those of its three saves (object half written, object renamed, manifest half written,
// manifest renamed, each garbage-collection removal). After every kill the store restores its last
// committed step bit-exactly (the step restored from a store that was never killed); the agent is then
// started again and, once the trainer is done, the store restores the newest step bit-exactly.
// Together with PecTools.KillDuringSaveNeverDamagesTheLastCommit (every crash point of one save) and
// PecTools.KillDuringRestoreLeavesNoOutput (every crash point of a restore) this makes well over 50
// kill points per CI run.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace kill_test {

namespace fs = std::filesystem;
using ucpkit::testing::file_bytes;
using ucpkit::testing::tree_bytes;

namespace {
const std::vector<int64_t> kSteps = {100, 200, 300};

std::string manifest(const std::string& store, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "/manifests/step-%012lld.json", static_cast<long long>(step));
  return store + name;
}

int64_t last_committed(const std::string& store) {
  int64_t last = -1;
  for (int64_t s : kSteps)
    if (fs::exists(manifest(store, s))) last = s;
  return last;
}

// The agent as a child process; `crash_after` > 0 sets UCPKIT_PEC_CRASH_AFTER.
// `keep`: the durable tier's --keep (the reference keeps every step so that each can be restored).
pid_t start_agent(const std::string& watched, const std::string& store, long crash_after, const std::string& log,
                  const char* keep = "2") {
  const pid_t pid = fork();
  if (pid == 0) {
    if (crash_after > 0) setenv("UCPKIT_PEC_CRASH_AFTER", std::to_string(crash_after).c_str(), 1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    const std::string bin = kBin + "/pec-save";
    execl(bin.c_str(), "pec-save", "--watch", watched.c_str(), "--store", store.c_str(), "--policy", "sequential", "--k",
          "1", "--poll-seconds", "0.05", "--keep", keep, (char*)nullptr);
    _exit(127);
  }
  return pid;
}

// The trainer: announces each step not yet committed and waits for its commit. Returns the agent's
// wait status once it ended (killed), or -1 when every step was committed (the agent still runs).
int train(const std::string& watched, const std::string& store, pid_t agent) {
  for (int64_t s : kSteps) {
    if (fs::exists(manifest(store, s))) continue;
    std::ofstream(watched + "/latest", std::ios::trunc) << "global_step" << s;  // in place, as DeepSpeed
    for (int i = 0; i < 6000 && !fs::exists(manifest(store, s)); ++i) {  // up to 60 s per step
      int st = 0;
      if (waitpid(agent, &st, WNOHANG) == agent) return st;
      usleep(5000);
    }
    if (!fs::exists(manifest(store, s))) {
      ADD_FAILURE() << "step " << s << " was never committed";
      kill(agent, SIGKILL);
      int st = 0;
      waitpid(agent, &st, 0);
      return st;
    }
  }
  return -1;
}

void stop(pid_t agent, int* status) {
  kill(agent, SIGTERM);
  waitpid(agent, status, 0);
}

int restore(const std::string& store, const std::string& out, const std::string& log) {
  return ucpkit::testing::run_logged(kBin + "/pec-restore -q --store " + store + " --output " + out, log);
}

void fill_watched(const std::string& watched) {
  for (int64_t s : kSteps) {
    const std::string tag = "global_step" + std::to_string(s);
    fs::copy(kFx + "/ds/step" + std::to_string(s) + "/" + tag, watched + "/" + tag, fs::copy_options::recursive);
  }
}
}  // namespace

TEST(PecKill, WatchLoopKilledAtRandomPointsKeepsTheLastCommit) {
  const std::string d = ucpkit::testing::scratch_dir("pec_kill_watch");
  // Reference: the same loop never killed; each step restored from it.
  fs::create_directories(d + "/ref_w");
  fill_watched(d + "/ref_w");
  const pid_t ref_agent = start_agent(d + "/ref_w", d + "/ref_s", 0, d + "/ref.log", "5");
  ASSERT_EQ(train(d + "/ref_w", d + "/ref_s", ref_agent), -1) << file_bytes(d + "/ref.log");
  int st = 0;
  stop(ref_agent, &st);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st << file_bytes(d + "/ref.log");
  std::map<int64_t, std::map<std::string, std::string>> ref;
  for (int64_t s : kSteps) {
    const std::string out = d + "/ref_o" + std::to_string(s);
    ASSERT_EQ(ucpkit::testing::run_command(kBin + "/pec-restore -q --store " + d + "/ref_s --output " + out + " --step " +
                                           std::to_string(s)),
              0);
    ref[s] = tree_bytes(out + "/global_step" + std::to_string(s));
  }

  // Crash points of the three saves: drawn uniformly in [1, 100] (the three saves of this fixture pass
  // 94 of them; a draw past the end of the loop is a clean run, checked, and drawn again).
  const unsigned seed = 20261123;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<long> point(1, 100);
  int kills = 0, tries = 0;
  for (; kills < 16 && tries < 40; ++tries) {
    const long n = point(rng);
    const std::string t = d + "/t" + std::to_string(tries), w = t + "/w", store = t + "/s";
    fs::create_directories(w);
    fill_watched(w);
    pid_t agent = start_agent(w, store, n, t + ".log");
    int status = train(w, store, agent);
    if (status == -1) stop(agent, &status);  // every step committed (a kill in the last GC may follow)
    if (WIFEXITED(status)) {  // past the last crash point: a clean run
      EXPECT_EQ(WEXITSTATUS(status), 0) << "point " << n << ": " << file_bytes(t + ".log");
      continue;
    }
    ++kills;
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "point " << n << ": " << file_bytes(t + ".log");
    // The last committed step restores bit-exactly (nothing committed: restore refuses, exit 1).
    const int64_t last = last_committed(store);
    const int rc = restore(store, t + "/o", t + "/o.log");
    if (last < 0) {
      EXPECT_EQ(rc, 1) << "point " << n << ": " << file_bytes(t + "/o.log");
      EXPECT_FALSE(fs::exists(t + "/o/latest")) << "point " << n;
    } else {
      ASSERT_EQ(rc, 0) << "point " << n << ": " << file_bytes(t + "/o.log");
      EXPECT_EQ(file_bytes(t + "/o/latest"), "global_step" + std::to_string(last)) << "point " << n;
      EXPECT_EQ(tree_bytes(t + "/o/global_step" + std::to_string(last)), ref.at(last)) << "point " << n;
    }
    // Started again, the agent saves what is left; the newest step restores bit-exactly.
    if (last < kSteps.back()) {
      agent = start_agent(w, store, 0, t + ".log");
      ASSERT_EQ(train(w, store, agent), -1) << "point " << n << ": " << file_bytes(t + ".log");
      stop(agent, &status);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "point " << n << ": " << status;
    }
    ASSERT_EQ(restore(store, t + "/o2", t + "/o2.log"), 0) << "point " << n << ": " << file_bytes(t + "/o2.log");
    EXPECT_EQ(tree_bytes(t + "/o2/global_step300"), ref.at(300)) << "point " << n;
    fs::remove_all(t);
  }
  EXPECT_GE(kills, 16) << "seed " << seed << ", " << tries << " draws";
}

}  // namespace kill_test
