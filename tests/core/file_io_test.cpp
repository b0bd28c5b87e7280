// core/file_io, core/registry, core/reporter and escaped_brief: the small shared pieces of issue 21.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/registry.h"
#include "core/reporter.h"
#include "files.h"
#include "support/process.h"

namespace file_io_test {

using namespace ucpkit;
using coretest::slurp;
namespace fs = std::filesystem;

TEST(FileIo, WriteAllThenPreadExactGivesTheBytesBack) {
  const fs::path dir = ucpkit::testing::scratch_dir("file_io_rw");
  const std::string path = (dir / "f.bin").string();
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 131) >> 3);
  {
    UniqueFd f = open_or_fail(path, O_WRONLY | O_CREAT | O_TRUNC);
    write_all(f.get(), data.data(), data.size(), path);
    pwrite_all(f.get(), "XY", 2, 10, path);
  }
  data[10] = 'X';
  data[11] = 'Y';
  EXPECT_EQ(slurp(path), data);
  UniqueFd r = open_or_fail(path, O_RDONLY);
  std::string back(1000, '\0');
  pread_exact(r.get(), back.data(), back.size(), 2 << 20, path);
  EXPECT_EQ(back, data.substr(2 << 20, 1000));
}

TEST(FileIo, ReadingPastTheEndNamesTheFile) {
  const fs::path dir = ucpkit::testing::scratch_dir("file_io_eof");
  const std::string path = (dir / "short.bin").string();
  {
    UniqueFd f = open_or_fail(path, O_WRONLY | O_CREAT | O_TRUNC);
    write_all(f.get(), "abc", 3, path);
  }
  UniqueFd r = open_or_fail(path, O_RDONLY);
  char buf[8];
  try {
    pread_exact(r.get(), buf, 8, 0, path);
    FAIL() << "read past the end accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": unexpected end of file");
  }
  try {
    open_or_fail((dir / "none").string(), O_RDONLY);
    FAIL() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / "none").string() + ": cannot open: No such file or directory");
  }
}

TEST(FileIo, UniqueFdClosesOnDestructionAndMoves) {
  int raw = -1;
  {
    UniqueFd a("/dev/null", O_RDONLY);
    ASSERT_TRUE(a);
    raw = a.get();
    UniqueFd b(std::move(a));
    EXPECT_FALSE(a);
    EXPECT_EQ(b.get(), raw);
    EXPECT_NE(::fcntl(raw, F_GETFD), -1);
  }
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);  // closed once, by b
}

namespace {
struct Shape {
  virtual ~Shape() = default;
  virtual int sides() const = 0;
};
struct Tri : Shape {
  int sides() const override { return 3; }
};
struct Sq : Shape {
  int sides() const override { return 4; }
};
}  // namespace

TEST(Registry, MakesByNameAndListsTheKnownOnesWhenUnknown) {
  Registry<Shape> r("shape");
  r.add("triangle", [] { return std::make_unique<Tri>(); });
  r.add("square", [] { return std::make_unique<Sq>(); });
  EXPECT_EQ(r.make("square")->sides(), 4);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"square", "triangle"}));
  try {
    r.make("circle");
    FAIL() << "unknown name accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "unknown shape 'circle' (known: square, triangle)");
  }
}

TEST(Reporter, DefaultSaysNothingAndCallbacksReceiveEveryLine) {
  Reporter quiet;
  quiet.warning("x");  // no callback: nothing happens
  Reporter::Bar none(quiet, "label", 10);
  none.advance();
  none.finish();

  std::vector<std::string> warnings, details;
  struct Count : ProgressSink {
    uint64_t* n;
    bool* done;
    Count(uint64_t* n_, bool* d) : n(n_), done(d) {}
    void advance(uint64_t k) override { *n += k; }
    void finish() override { *done = true; }
  };
  uint64_t steps = 0;
  bool finished = false;
  Reporter r;
  r.warn = [&](const std::string& s) { warnings.push_back(s); };
  r.verbose = [&](const std::string& s) { details.push_back(s); };
  r.progress = [&](const std::string&, uint64_t) -> std::unique_ptr<ProgressSink> {
    return std::make_unique<Count>(&steps, &finished);
  };
  r.warning("w1");
  r.detail("d1");
  Reporter::Bar bar(r, "label", 3);
  bar.advance();
  bar.advance(2);
  bar.finish();
  Reporter::Bar off(r, "label", 3, /*enabled=*/false);
  off.advance();
  EXPECT_EQ(warnings, std::vector<std::string>{"w1"});
  EXPECT_EQ(details, std::vector<std::string>{"d1"});
  EXPECT_EQ(steps, 3u);
  EXPECT_TRUE(finished);
}

TEST(EscapedBrief, EscapesBackslashesControlAndNonAsciiAndCuts) {
  EXPECT_EQ(escaped_brief("a\\b\n\xff"), "a\\x5cb\\x0a\\xff");
  EXPECT_EQ(escaped_brief(std::string(10, 'z'), 4), "zzzz...");
}

// open_input refuses what is not a regular file before it can block (a FIFO with no writer blocked a
// plain open for ever, issue 45), and gives a descriptor whose reads block as usual.
TEST(FileIo, OpenInputRefusesSpecialFilesAtOnce) {
  const fs::path dir = ucpkit::testing::scratch_dir("file_io_input");
  const std::string fifo = (dir / ".metadata").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  ucpkit::testing::within(std::chrono::seconds(10), "open_input of a FIFO", [&] {
    try {
      (void)open_input(fifo, "metadata file");
      FAIL() << "a FIFO was opened";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), fifo + ": the metadata file is a FIFO (named pipe), not a regular file; nothing was read from it");
    }
  });
  EXPECT_THROW((void)open_input(dir.string()), Error);  // a folder
  EXPECT_THROW((void)open_input("/dev/null"), Error);   // a character device
  const std::string file = (dir / "f").string();
  { UniqueFd w = open_or_fail(file, O_WRONLY | O_CREAT); write_all(w.get(), "abc", 3, file); }
  UniqueFd r = open_input(file);
  EXPECT_EQ(::fcntl(r.get(), F_GETFL) & O_NONBLOCK, 0);
  char buf[3];
  pread_exact(r.get(), buf, 3, 0, file);
  EXPECT_EQ(std::string(buf, 3), "abc");
}

}  // namespace file_io_test
