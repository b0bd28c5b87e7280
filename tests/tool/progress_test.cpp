// Progress where it is read (issue 28 item 8): on a stderr that is not a terminal, paced progress
// lines (percent, done of total, rate, ETA) for work longer than a few seconds and nothing for short
// work; -v prints the phases and their times. The pacing (UCPKIT_PROGRESS_AFTER / _EVERY) is driven
// by the tests: the text and the pacer in-process, then real ucp-union runs whose stderr is a pipe.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/reporter.h"
#include "support/process.h"
#include "tool/progress.h"

namespace progress_test {

namespace fs = std::filesystem;
using namespace ucpkit::tool;

namespace {

// The tools: $UCPKIT_BIN when set (to run these tests against another build), else this build's.
std::string tool_dir() {
  const char* bin = std::getenv("UCPKIT_BIN");
  return bin && *bin ? bin : UCPKIT_BIN_DIR;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST(Progress, LineTextSaysPercentDoneOfTotalRateAndEta) {
  // 3 of 7 items in 6 s: 0.5 items/s, 4 left -> 8 s.
  EXPECT_EQ(progress_text(3, 7, 6.0, ProgressUnit::items), "42% (3 of 7 items), 0.50 items/s, ETA 8s");
  // 1.5 GiB of 3 GiB in 10 s: 153.6 MiB/s, the other half in 10 s.
  EXPECT_EQ(progress_text(3ull << 29, 3ull << 30, 10.0, ProgressUnit::bytes),
            "50% (1.5 GiB of 3.0 GiB), 153.6 MiB/s, ETA 10s");
  // Minutes and hours; nothing done yet has no rate.
  EXPECT_EQ(progress_text(100, 1000, 20.0, ProgressUnit::items), "10% (100 of 1000 items), 5.00 items/s, ETA 3m00s");
  EXPECT_EQ(progress_text(1, 1000, 10.0, ProgressUnit::items), "0% (1 of 1000 items), 0.10 items/s, ETA 2h46m");
  EXPECT_EQ(progress_text(0, 5, 3.0, ProgressUnit::items), "0% (0 of 5 items), rate ?, ETA ?");
  EXPECT_EQ(progress_end_text(7, 7, 14.0, ProgressUnit::items), "done, 7 items in 14.0 s (0.50 items/s)");
  EXPECT_EQ(progress_end_text(512, 2048, 2.0, ProgressUnit::bytes), "stopped at 25% (512 B of 2.0 KiB) after 2.0 s");
}

TEST(Progress, PacerWritesNothingForShortWorkThenOneLinePerInterval) {
  LinePacer p({5, 10});  // the defaults: after 5 s, every 10 s
  EXPECT_FALSE(p.due(0.5));
  EXPECT_FALSE(p.due(4.9));
  EXPECT_FALSE(p.end_line(4.9));  // work that ends before 5 s writes no line at all
  EXPECT_TRUE(p.due(5.0));
  EXPECT_FALSE(p.due(6));
  EXPECT_FALSE(p.due(14.9));
  EXPECT_TRUE(p.due(15.1));
  EXPECT_FALSE(p.due(25.0));  // 9.9 s after the last line
  EXPECT_TRUE(p.due(25.2));
  EXPECT_TRUE(p.end_line(26));
  EXPECT_TRUE(p.any());
  LinePacer q({5, 10});
  EXPECT_TRUE(q.end_line(7));  // a long single step: no line while it ran, one at its end
  EXPECT_FALSE(q.any());       // (work stopped short by an error adds a line only after some)
}

TEST(Progress, PacingComesFromTheEnvironment) {
  ::unsetenv("UCPKIT_PROGRESS_AFTER");
  ::unsetenv("UCPKIT_PROGRESS_EVERY");
  EXPECT_EQ(ProgressPacing::from_environment().after, 5);
  EXPECT_EQ(ProgressPacing::from_environment().every, 10);
  ::setenv("UCPKIT_PROGRESS_AFTER", "0", 1);
  ::setenv("UCPKIT_PROGRESS_EVERY", "2.5", 1);
  EXPECT_EQ(ProgressPacing::from_environment().after, 0);
  EXPECT_EQ(ProgressPacing::from_environment().every, 2.5);
  ::setenv("UCPKIT_PROGRESS_EVERY", "soon", 1);  // not a number: the default
  EXPECT_EQ(ProgressPacing::from_environment().every, 10);
  ::unsetenv("UCPKIT_PROGRESS_AFTER");
  ::unsetenv("UCPKIT_PROGRESS_EVERY");
}

TEST(Progress, PhasesReportEachStartAndTimeInOrder) {
  ucpkit::Reporter r;
  std::vector<std::string> seen;
  r.phase = [&](const std::string& name, ucpkit::Reporter::PhaseEvent e, double s) {
    EXPECT_GE(s, 0);
    seen.push_back(name + (e == ucpkit::Reporter::PhaseEvent::start ? " start"
                           : e == ucpkit::Reporter::PhaseEvent::end ? " end"
                                                                     : " stopped"));
  };
  {
    ucpkit::Reporter::Phase p(r, "read");
    p.next("write");
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"read start", "read end", "write start", "write end"}));
  seen.clear();
  try {
    ucpkit::Reporter::Phase p(r, "plan");
    throw std::runtime_error("x");
  } catch (const std::exception&) {
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"plan start", "plan stopped"}));
  ucpkit::Reporter silent;  // no phase sink: nothing to call
  ucpkit::Reporter::Phase p(silent, "nothing");
  p.next("still nothing");
}

// ucp-union on the fixture checkpoint, run as a job script runs it (relative paths, from another
// folder), stdout and stderr into a pipe.
class ProgressRun : public ::testing::Test {
 protected:
  void SetUp() override {
    input = fs::path(UCPKIT_FIXTURES_DIR) / "gpt";
    if (!fs::exists(input / "latest")) GTEST_SKIP() << input << " missing: run ctest -R '^fixtures_tool$'";
    work = ucpkit::testing::scratch_dir("progress_run");
  }
  // Output lines of `ucp-union --input <rel> --output uni <extra>` under `env`.
  std::vector<std::string> run(const std::string& env, const std::string& extra, int* params = nullptr) {
    fs::remove_all(fs::path(work) / "uni");
    const std::string rel = fs::relative(input, work).string();
    std::string out;
    const int rc = ucpkit::testing::run_command_status(
        "cd " + ucpkit::testing::quote(work) + " && env " + env + " " + tool_dir() + "/ucp-union --input " +
            ucpkit::testing::quote(rel) + " --output uni " + extra,
        &out);
    EXPECT_EQ(rc, 0) << out;
    if (params) {
      *params = 0;
      for (const auto& e : fs::directory_iterator(fs::path(work) / "uni" / "zero"))
        if (e.is_directory()) ++*params;
    }
    return lines_of(out);
  }
  fs::path input;
  std::string work;
};

TEST_F(ProgressRun, PipedStderrGetsPacedLinesAndNothingForShortWork) {
  const std::regex line(R"(ucp-union: (\d+)% \((\d+) of (\d+) items\), ([0-9.]+ items/s|rate \?), ETA (\S+))");
  const std::regex end(R"(ucp-union: done, (\d+) items in [0-9.]+ s \([0-9.]+ items/s\))");
  // Every advance due (after 0 s, every 0 s): one line per parameter joined, then the end line.
  int params = 0;
  std::vector<std::string> out = run("UCPKIT_PROGRESS_AFTER=0 UCPKIT_PROGRESS_EVERY=0", "", &params);
  ASSERT_GT(params, 1);
  std::vector<std::smatch> seen;
  int last_done = 0, ends = 0;
  for (const auto& l : out) {
    std::smatch m;
    if (std::regex_match(l, m, line)) {
      const int pct = std::stoi(m[1]), done = std::stoi(m[2]), total = std::stoi(m[3]);
      EXPECT_EQ(total, params) << l;
      EXPECT_EQ(done, last_done + 1) << l;
      EXPECT_EQ(pct, done * 100 / total) << l;
      last_done = done;
    } else if (std::regex_match(l, m, end)) {
      EXPECT_EQ(std::stoi(m[1]), params) << l;
      ++ends;
    } else {
      EXPECT_EQ(l.find('%'), std::string::npos) << "unexpected progress text: " << l;
      EXPECT_EQ(l.find('\r'), std::string::npos) << "a terminal bar in a pipe: " << l;
    }
  }
  EXPECT_EQ(last_done, params);
  EXPECT_EQ(ends, 1);
  // At most one line per interval: with 1000 s, only the first line (and the end line).
  out = run("UCPKIT_PROGRESS_AFTER=0 UCPKIT_PROGRESS_EVERY=1000", "");
  int progress_lines = 0;
  for (const auto& l : out) progress_lines += std::regex_match(l, line) ? 1 : 0;
  EXPECT_EQ(progress_lines, 1);
  // Short work (here: shorter than 30 s) writes no progress line at all; -q none either.
  for (const char* extra : {"", "-q"}) {
    out = run("UCPKIT_PROGRESS_AFTER=30 UCPKIT_PROGRESS_EVERY=0", extra);
    for (const auto& l : out) EXPECT_EQ(l.find('%'), std::string::npos) << l;
  }
  out = run("UCPKIT_PROGRESS_AFTER=0 UCPKIT_PROGRESS_EVERY=0", "-q");
  for (const auto& l : out) EXPECT_EQ(l.find('%'), std::string::npos) << l;
}

TEST_F(ProgressRun, VerbosePrintsPhaseNamesAndTimes) {
  const std::regex started(R"(ucp-union: phase (.+): started)");
  const std::regex timed(R"(ucp-union: phase (.+): ([0-9]+\.[0-9]{3}) s)");
  std::vector<std::string> out = run("", "-v");
  std::vector<std::string> starts, ends;
  for (const auto& l : out) {
    std::smatch m;
    if (std::regex_match(l, m, started)) starts.push_back(m[1]);
    if (std::regex_match(l, m, timed)) {
      ends.push_back(m[1]);
      EXPECT_GE(std::stod(m[2]), 0.0);
    }
  }
  EXPECT_EQ(starts, (std::vector<std::string>{"plan", "join parameters", "manifest and commit"}));
  EXPECT_EQ(ends, starts);  // each phase ends, in order, before the next starts
  // Without -v no phase line.
  for (const auto& l : run("", "")) EXPECT_EQ(l.find("phase"), std::string::npos) << l;
}

}  // namespace progress_test
