// moe-replace and its temporary files (issue 32): a SIGINT/SIGTERM while the outputs are staged
// removes them and ends the run by the signal with nothing written; a temporary file of a run that
// is gone is swept by the next run on the same output.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <utime.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "test_data.h"

namespace cli_signal_test {

namespace fs = std::filesystem;

namespace {

std::string binary() {
  const std::string dir = placement_test::tool_dir();
  return dir.empty() ? std::string() : dir + "/moe-replace";
}

class CliSignal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (binary().empty() || !fs::exists(binary())) GTEST_SKIP() << "UCPKIT_BIN/moe-replace not built";
    dir = fs::temp_directory_path() / ("moe_replace_signal_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "loads.json") << "[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]";
  }
  void TearDown() override {
    if (!dir.empty()) fs::remove_all(dir);
  }
  std::vector<std::string> args(const std::string& output) const {
    return {binary(), "--loads", (dir / "loads.json").string(), "--nodes", "4", "--gpus-per-node", "4",
            "--slots-per-gpu", "2", "--output", output, "--svg", (dir / "plan.svg").string(), "-q"};
  }
  // Runs moe-replace with `env` set in the child; returns its pid (not waited for).
  pid_t spawn(const std::vector<std::string>& a, const std::string& env_name = "", const std::string& env_value = "") {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!env_name.empty()) ::setenv(env_name.c_str(), env_value.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& s : a) argv.push_back(const_cast<char*>(s.c_str()));
      argv.push_back(nullptr);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir;
};

// A pid that belonged to a process that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

TEST_F(CliSignal, SignalWhileStagedRemovesTemporariesAndEndsByTheSignal) {
  for (int sig : {SIGINT, SIGTERM}) {
    const std::string marker = (dir / "staged").string();
    fs::remove(marker);
    const pid_t pid = spawn(args((dir / "plan.json").string()), "UCPKIT_TEST_PAUSE_MOE_WRITE", marker);
    ASSERT_GT(pid, 0);
    for (int i = 0; i < 3000 && !fs::exists(marker); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(fs::exists(marker)) << "the run never reached its staged outputs";
    // Both temporary files exist at this point (the staged outputs), nothing is renamed yet.
    int temps = 0;
    for (const auto& n : names()) temps += n.find(".tmp.") != std::string::npos;
    EXPECT_EQ(temps, 2);
    ::kill(pid, sig);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
    EXPECT_EQ(WTERMSIG(status), sig);
    fs::remove(marker);
    EXPECT_EQ(names(), std::vector<std::string>({"loads.json"})) << "signal " << sig;
  }
}

TEST_F(CliSignal, StaleTemporariesOfAGoneRunAreSwept) {
  const std::string plan = (dir / "plan.json").string();
  const pid_t gone = dead_pid();
  auto make = [&](const std::string& name, bool old) {
    std::ofstream(dir / name) << "partial";
    if (old) {
      struct utimbuf t {};
      t.actime = t.modtime = ::time(nullptr) - 3600;
      ::utime((dir / name).c_str(), &t);
    }
  };
  const std::string stale = "plan.json.tmp." + std::to_string(gone) + ".0";
  const std::string stale_svg = "plan.svg.tmp." + std::to_string(gone) + ".3";
  const std::string fresh = "plan.json.tmp." + std::to_string(gone) + ".1";       // written a moment ago: kept
  const std::string alive = "plan.json.tmp." + std::to_string(::getpid()) + ".0";  // its process runs: kept
  const std::string other = "other.json.tmp." + std::to_string(gone) + ".0";       // not an output of this run
  const std::string odd = "plan.json.tmp." + std::to_string(gone) + ".x";          // not AtomicFile's naming
  make(stale, true);
  make(stale_svg, true);
  make(fresh, false);
  make(alive, true);
  make(other, true);
  make(odd, true);
  const pid_t pid = spawn(args(plan));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::vector<std::string> want = {alive, fresh, "loads.json", odd, other, "plan.json", "plan.svg"};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(names(), want);
}

}  // namespace

}  // namespace cli_signal_test
