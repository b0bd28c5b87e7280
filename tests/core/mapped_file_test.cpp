// A mapped input that shrinks while it is read (issue 32, cause 1): the first access past the new end
// raises SIGBUS. MappedFile guards its mappings: the read goes on (on zeros), no process dies, and no
// output is committed afterwards (check_inputs_intact names the file). Each case runs in a child process
// (gtest death-test fork), since the "an input shrank" record is process-wide and sticky by design.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// Resident kB of the mapping that holds `p` (/proc/self/smaps), -1 when none does.
long resident_kb(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool in = false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find(' ')) in = lo <= a && a < hi;
    else if (in && line.rfind("Rss:", 0) == 0) return std::stol(line.substr(4));
  }
  return -1;
}

TEST(MappedFileDrop, SmallRangesAreDroppedTogetherAndReadAgain) {
  const std::string dir = ucpkit::testing::scratch_dir("mapped_drop");
  const size_t page = ::sysconf(_SC_PAGESIZE), pages = (MappedFile::kDropBatch + (8u << 20)) / page;
  auto m = MappedFile::open(make_file(dir, static_cast<int>(pages)).string());
  long sum = 0;
  for (size_t i = 0; i < m->size(); i += page) sum += m->data()[i];
  EXPECT_EQ(sum, static_cast<long>(pages) * 0x5a);
  const long all = resident_kb(m->data());
  ASSERT_GE(all, static_cast<long>(m->size() / 1024) - 64);
  // Items of 1.6 KB, one after another: none is dropped alone, the first kDropBatch bytes of them at once.
  const size_t item = 1600;
  size_t at = 0;
  for (; at + item < MappedFile::kDropBatch - item; at += item) m->drop_pages({m->data() + at, item});
  EXPECT_GE(resident_kb(m->data()), all - 64);
  for (; at < MappedFile::kDropBatch + item; at += item) m->drop_pages({m->data() + at, item});
  EXPECT_LE(resident_kb(m->data()), all - static_cast<long>(MappedFile::kDropBatch / 1024) + 64);
  // A dropped page reads its bytes again (from the page cache); memory outside the map is never dropped.
  EXPECT_EQ(m->data()[page], 0x5a);
  std::vector<uint8_t> heap(4 * page, 7);
  m->drop_pages({heap.data(), heap.size()});
  EXPECT_EQ(heap[page], 7);
  // Ranges waiting together span the pages between them: once they span kDropBatch, all of those are dropped.
  const long before = resident_kb(m->data());
  m->drop_pages({m->data() + m->size() - (8u << 20), 8u << 20});
  m->drop_pages({m->data(), page});
  EXPECT_LE(resident_kb(m->data()), before - 8 * 1024 + 64);
}

}  // namespace mapped_file_test
