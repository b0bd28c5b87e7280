// The tool driver helpers (lib/tool/tool.cpp): run()'s exit codes and its one error line (escaped,
// cut, rank 0 only for usage errors, nothing for ReportedElsewhere), the --json error envelope and the
// file it names, verbosity of info / verbose / warn, launcher_rank from the launcher's environment,
// and console_reporter's lines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/files.h"
#include "support/process.h"
#include "tool/tool.h"

namespace tool_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using tool::run;

namespace {

// stderr and the exit code of run("t", body).
std::pair<int, std::string> run_capturing(const std::function<int()>& body) {
  ::testing::internal::CaptureStderr();
  const int rc = run("t", body);
  return {rc, ::testing::internal::GetCapturedStderr()};
}

// Sets an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~EnvVar() { ::unsetenv(name_); }

 private:
  const char* name_;
};

// Restores the normal verbosity after a test changes it.
struct Verbosity {
  explicit Verbosity(int level) { tool::set_verbosity(level); }
  ~Verbosity() { tool::set_verbosity(0); }
};

}  // namespace

TEST(ToolRun, ReturnsTheBodysCodeAndNamesTheTool) {
  auto [rc, err] = run_capturing([] { return 0; });
  EXPECT_EQ(rc, tool::kSuccess);
  EXPECT_EQ(err, "");
  EXPECT_EQ(run("other", [] { return 7; }), 7);
  EXPECT_STREQ(tool::tool_name(), "other");
}

TEST(ToolRun, MapsEachErrorToItsExitCodeAndOneLine) {
  auto [usage, usage_err] = run_capturing([]() -> int { throw UsageError("--tp must be positive"); });
  EXPECT_EQ(usage, tool::kUsage);
  EXPECT_EQ(usage_err, "t: error: --tp must be positive\n");
  auto [failure, failure_err] = run_capturing([]() -> int { throw Error("a.pt: truncated"); });
  EXPECT_EQ(failure, tool::kFailure);
  EXPECT_EQ(failure_err, "t: error: a.pt: truncated\n");
  auto [other, other_err] = run_capturing([]() -> int { throw std::out_of_range("vector"); });
  EXPECT_EQ(other, tool::kFailure);
  EXPECT_EQ(other_err, "t: error: vector\n");
  // Another rank's failure: rank 0 reports it, this one says nothing.
  auto [elsewhere, elsewhere_err] = run_capturing([]() -> int { throw ReportedElsewhere("rank 3 failed"); });
  EXPECT_EQ(elsewhere, tool::kFailure);
  EXPECT_EQ(elsewhere_err, "");
}

TEST(ToolRun, ErrorLineIsEscapedAndCut) {
  auto [rc, err] = run_capturing([]() -> int { throw Error("bad\nname \x01\xc3\xa9"); });
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(err, "t: error: bad\\x0aname \\x01\\xc3\\xa9\n");
  auto [rc2, long_err] = run_capturing([]() -> int { throw Error(std::string(1000, 'x')); });
  EXPECT_EQ(long_err, "t: error: " + std::string(600, 'x') + "...\n");
}

TEST(ToolRun, UsageErrorsArePrintedByRankZeroOnly) {
  EXPECT_EQ(tool::launcher_rank(), 0);
  EnvVar rank("OMPI_COMM_WORLD_RANK", "3");
  EXPECT_EQ(tool::launcher_rank(), 3);
  auto [rc, err] = run_capturing([]() -> int { throw UsageError("--tp must be positive"); });
  EXPECT_EQ(rc, tool::kUsage);
  EXPECT_EQ(err, "");
  // Runtime failures differ between ranks: every rank says its own.
  auto [rc2, err2] = run_capturing([]() -> int { throw Error("x"); });
  EXPECT_EQ(err2, "t: error: x\n");
}

TEST(ToolRun, LauncherRankFromPmixOrPmi) {
  {
    EnvVar rank("PMIX_RANK", "5");
    EXPECT_EQ(tool::launcher_rank(), 5);
  }
  {
    EnvVar rank("PMI_RANK", "2");
    EnvVar empty("OMPI_COMM_WORLD_RANK", "");  // empty: not set
    EXPECT_EQ(tool::launcher_rank(), 2);
  }
}

// With --json a failed run prints the envelope with the error, naming the file when the message
// begins with a path on disk (or in a folder on disk); an option is not a file. A process prints one
// envelope at most (print_json marks the summary printed, for good): each case runs in a child, and
// the cases run in a fresh copy of this binary (another test of the tests/tool binary may have printed
// an envelope in this process already, and a forked child inherits that mark).
TEST(ToolRun, JsonErrorEnvelopeNamesTheFile) {
  const std::string cmd = "UCPKIT_TOOL_TEST_FRESH=1 /proc/" + std::to_string(::getpid()) +
                          "/exe --gtest_filter=ToolRunFresh.JsonErrorEnvelopeNamesTheFile 2>&1";
  std::string out;
  EXPECT_EQ(ucpkit::testing::run_command(cmd, &out), 0) << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
}

TEST(ToolRunFresh, JsonErrorEnvelopeNamesTheFile) {
  if (!std::getenv("UCPKIT_TOOL_TEST_FRESH")) GTEST_SKIP() << "run by ToolRun.JsonErrorEnvelopeNamesTheFile";
  const fs::path dir = fs::temp_directory_path() / ("tool_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string missing = (dir / "missing.pt").string(), out = (dir / "stdout").string();
  // The child's stdout and exit code.
  auto in_child = [&](const std::function<int()>& body, bool summary_first = false) -> std::pair<int, std::string> {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen("/dev/null", "w", stderr)) ::_exit(99);
      tool::set_json(true);
      if (summary_first) tool::summary_printed();
      const int rc = run("ucp-x", body);
      std::cout.flush();
      std::fflush(nullptr);
      ::_exit(rc);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ucpkit::testing::file_bytes(out)};
  };
  {
    auto [rc, text] = in_child([&]() -> int { throw Error(missing + ": not found"); });
    EXPECT_EQ(rc, 1);
    const auto j = nlohmann::json::parse(text);
    EXPECT_EQ(j.at("tool"), "ucp-x");
    EXPECT_TRUE(j.at("output").is_null());
    EXPECT_EQ(j.at("error").at("message"), missing + ": not found");
    EXPECT_EQ(j.at("error").at("exit_code"), 1);
    EXPECT_EQ(j.at("error").at("file"), missing);
  }
  {
    auto [rc, text] = in_child([]() -> int { throw UsageError("--tp: must be positive"); });
    EXPECT_EQ(rc, 2);
    const auto j = nlohmann::json::parse(text);
    EXPECT_EQ(j.at("error").at("exit_code"), 2);
    EXPECT_TRUE(j.at("error").at("file").is_null());
  }
  {
    auto [rc, text] = in_child([]() -> int { throw Error("/no/such/dir/x.pt: bad"); });
    EXPECT_TRUE(nlohmann::json::parse(text).at("error").at("file").is_null());
  }
  {
    auto [rc, text] = in_child([]() -> int { throw Error("x"); }, true);  // a summary printed already
    EXPECT_EQ(rc, 1);
    EXPECT_EQ(text, "");
  }
  {
    auto [rc, text] = in_child([]() -> int { return 0; });  // success: no envelope from run()
    EXPECT_EQ(rc, 0);
    EXPECT_EQ(text, "");
  }
  fs::remove_all(dir);
}

TEST(ToolMessages, VerbosityDecidesWhatIsShown) {
  auto said = [](int level) {
    Verbosity v(level);
    EXPECT_EQ(tool::verbosity(), level);
    ::testing::internal::CaptureStderr();
    tool::info("i");
    tool::verbose("v");
    tool::warn("w");
    return ::testing::internal::GetCapturedStderr();
  };
  const std::string name = tool::tool_name();
  EXPECT_EQ(said(-1), name + ": warning: w\n");
  EXPECT_EQ(said(0), name + ": i\n" + name + ": warning: w\n");
  EXPECT_EQ(said(1), name + ": i\n" + name + ": v\n" + name + ": warning: w\n");
}

TEST(ToolMessages, ConsoleReporterSaysWarningsDetailsAndPhases) {
  const Reporter r = tool::console_reporter();
  const std::string name = tool::tool_name();
  ::testing::internal::CaptureStderr();
  r.warn("careful");
  r.verbose("hidden");
  r.phase("plan", Reporter::PhaseEvent::end, 1.5);  // phases only with -v
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), name + ": warning: careful\n");
  Verbosity v(1);
  ::testing::internal::CaptureStderr();
  r.verbose("shown");
  r.phase("plan", Reporter::PhaseEvent::start, 0);
  r.phase("plan", Reporter::PhaseEvent::end, 1.5);
  r.phase("write", Reporter::PhaseEvent::stopped, 0.25);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), name + ": shown\n" + name + ": phase plan: started\n" + name +
                                                          ": phase plan: 1.500 s\n" + name +
                                                          ": phase write: stopped after 0.250 s\n");
  EXPECT_TRUE(r.progress);
}

TEST(ToolMessages, PeakRssIsPositive) { EXPECT_GT(tool::peak_rss_bytes(), 0u); }

}  // namespace tool_test
