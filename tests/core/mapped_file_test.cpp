// A mapped input that shrinks while it is read (issue 32, cause 1): the first access past the new end
// raises SIGBUS. MappedFile guards its mappings: the read goes on (on zeros), no process dies, and no
// output is committed afterwards (check_inputs_intact names the file). Each case runs in a child process
// (gtest death-test fork), since the "an input shrank" record is process-wide and sticky by design.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/mapped_file.h"
#include "support/process.h"

namespace mapped_file_test {

namespace fs = std::filesystem;
using ucpkit::MappedFile;

namespace {

// A file of `pages` pages of 0x5a bytes.
fs::path make_file(const std::string& dir, int pages) {
  const fs::path p = fs::path(dir) / "shard.pt";
  std::ofstream(p, std::ios::binary) << std::string(static_cast<size_t>(pages) * ::sysconf(_SC_PAGESIZE), '\x5a');
  return p;
}

// Exit codes of the child: 0 all expectations held; others name the first that failed.
int shrink_then_read(const fs::path& file, const fs::path& out) {
  auto m = MappedFile::open(file.string());
  const size_t page = ::sysconf(_SC_PAGESIZE);
  if (m->data()[0] != 0x5a) return 10;
  fs::resize_file(file, page);                 // another process truncates the shard
  volatile uint8_t past = m->data()[2 * page];  // SIGBUS without the guard
  if (past != 0) return 11;                     // the rest of the mapping reads as zeros
  if (m->data()[0] != 0x5a) return 12;          // what was still in the file is untouched
  try {
    MappedFile::check_inputs_intact();
    return 13;
  } catch (const ucpkit::Error& e) {
    const std::string w = e.what();
    if (w.find(file.string()) == std::string::npos || w.find("shrank") == std::string::npos) return 14;
  }
  try {
    ucpkit::AtomicFile f(out.string());
    f.write("x", 1);
    f.commit();
    return 15;                                  // an output committed after reading a shrunken input
  } catch (const ucpkit::Error&) {
  }
  if (fs::exists(out)) return 16;
  return 0;
}

}  // namespace

TEST(MappedFileShrink, ReadPastTheNewEndGoesOnAndNothingIsCommitted) {
  const std::string dir = ucpkit::testing::scratch_dir("mapped_shrink");
  const fs::path file = make_file(dir, 4);
  EXPECT_EXIT(std::exit(shrink_then_read(file, fs::path(dir) / "out.bin")), ::testing::ExitedWithCode(0), "");
}

TEST(MappedFileShrink, AnIntactInputCommits) {
  const std::string dir = ucpkit::testing::scratch_dir("mapped_intact");
  const fs::path file = make_file(dir, 4);
  auto m = MappedFile::open(file.string());
  EXPECT_EQ(m->data()[3 * ::sysconf(_SC_PAGESIZE)], 0x5a);
  EXPECT_NO_THROW(MappedFile::check_inputs_intact());
  ucpkit::AtomicFile f((fs::path(dir) / "out.bin").string());
  f.write("x", 1);
  EXPECT_NO_THROW(f.commit());
}

TEST(MappedFileShrink, ASigbusElsewhereStillEndsTheProcess) {
  const std::string dir = ucpkit::testing::scratch_dir("mapped_other");
  const fs::path file = make_file(dir, 1);
  EXPECT_EXIT(
      {
        auto m = MappedFile::open(file.string());  // installs the guard
        ::raise(SIGBUS);                           // not an access inside a mapping of ours
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGBUS), "");
}

}  // namespace mapped_file_test
