// core/atomic_file: the target appears only at commit, whole; an uncommitted file leaves nothing;
// holes read as zeros; patches land both in the buffer and in bytes already written out.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "files.h"
#include "support/process.h"

namespace atomic_file_test {

using namespace ucpkit;
using coretest::entries;
using coretest::slurp;
namespace fs = std::filesystem;

TEST(AtomicFile, TargetAppearsOnlyAtCommitWithEveryByte) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_commit");
  const fs::path target = dir / "out.bin";
  std::mt19937 rng(5);
  std::string expect;
  {
    AtomicFile f(target.string(), /*durable=*/true);
    // Small writes (buffered), one larger than the buffer (written through), zeros.
    for (int i = 0; i < 1000; ++i) {
      std::string piece(rng() % 300, static_cast<char>('a' + i % 26));
      f.write(piece.data(), piece.size());
      expect += piece;
    }
    std::string big(3u << 20, 'B');
    f.write(big.data(), big.size());
    expect += big;
    f.write_zeros(10000);
    expect += std::string(10000, '\0');
    EXPECT_FALSE(fs::exists(target));
    EXPECT_EQ(f.offset(), expect.size());
    f.commit();
  }
  EXPECT_EQ(slurp(target), expect);
  EXPECT_EQ(entries(dir), 1u) << "temporary file left beside the target";
}

TEST(AtomicFile, UncommittedFileLeavesNothingAndKeepsAnOldTarget) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_abort");
  const fs::path target = dir / "out.bin";
  { std::ofstream(target) << "old"; }
  try {
    AtomicFile f(target.string());
    f.write("new", 3);
    throw std::runtime_error("stop before commit");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(slurp(target), "old");
  EXPECT_EQ(entries(dir), 1u);
}

// A content-addressed store (pec's put_stream): the bytes are written under a placeholder name, the
// header patched, the write-back started, then renamed to the name only known now. flush() puts the
// bytes so far into the temporary file (what a crash point there must find).
TEST(AtomicFile, CommitAsRenamesToANameKnownOnlyAtTheEnd) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_commit_as");
  {
    AtomicFile f((dir / ".put").string());
    f.write("HDR?", 4);
    f.write("payload", 7);
    f.flush();
    ASSERT_EQ(entries(dir), 1u);
    const fs::path temp = fs::directory_iterator(dir)->path();
    EXPECT_EQ(temp.filename().string().rfind(".put.tmp.", 0), 0u) << temp;
    EXPECT_EQ(slurp(temp), "HDR?payload");
    f.write("!", 1);
    f.pwrite_at(3, {reinterpret_cast<const uint8_t*>("1"), 1});
    f.start_writeback();
    f.commit_as((dir / "ab12").string());
  }
  EXPECT_EQ(slurp(dir / "ab12"), "HDR1payload!");
  EXPECT_FALSE(fs::exists(dir / ".put"));
  EXPECT_EQ(entries(dir), 1u) << "temporary file left";
  // Into another folder of the same file system (objects/<2 hex>/<id>), and a write larger than half
  // the buffer (written straight through) before a small one.
  fs::create_directories(dir / "cd");
  const std::string big(700u << 10, 'x');
  {
    AtomicFile f((dir / ".put").string());
    f.write(big.data(), big.size());
    f.write("end", 3);
    f.commit_as((dir / "cd" / "cd34").string());
  }
  EXPECT_EQ(slurp(dir / "cd" / "cd34"), big + "end");
  EXPECT_EQ(entries(dir), 2u) << "temporary file left";
}

TEST(AtomicFile, SkippedBytesReadAsZerosAndPatchesLandEverywhere) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_patch");
  const fs::path target = dir / "out.bin";
  std::string expect;
  {
    AtomicFile f(target.string());
    std::string head(2u << 20, 'h');  // beyond the buffer: written out to the file
    f.write(head.data(), head.size());
    f.skip(4096);
    f.write("tail", 4);
    expect = head + std::string(4096, '\0') + "tail";
    const std::string p1 = "PATCH-IN-FILE", p2 = "HOLE", p3 = "BUF";
    f.pwrite_at(100, {reinterpret_cast<const uint8_t*>(p1.data()), p1.size()});
    f.pwrite_at(head.size() + 10, {reinterpret_cast<const uint8_t*>(p2.data()), p2.size()});
    f.pwrite_at(head.size() + 4096 + 1, {reinterpret_cast<const uint8_t*>(p3.data()), p3.size()});
    expect.replace(100, p1.size(), p1);
    expect.replace(head.size() + 10, p2.size(), p2);
    expect.replace(head.size() + 4096 + 1, p3.size(), p3);
    const uint8_t x = 'x';
    EXPECT_THROW(f.pwrite_at(f.offset(), {&x, 1}), Error) << "a patch past the written end must be refused";
    f.commit();
  }
  EXPECT_EQ(slurp(target), expect);
}

TEST(AtomicFile, HoleAtTheEndStillExtendsTheFile) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_hole_end");
  const fs::path target = dir / "out.bin";
  {
    AtomicFile f(target.string());
    f.write("ab", 2);
    f.skip(1000);
    f.commit();
  }
  EXPECT_EQ(slurp(target), std::string("ab") + std::string(1000, '\0'));
}

TEST(AtomicFile, ErrorsNameTheTarget) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_errors");
  const std::string target = (dir / "no-such-folder" / "out.bin").string();
  try {
    AtomicFile f(target);
    FAIL() << "created a file in a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(target + ": ", 0), 0u) << e.what();
  }
  EXPECT_THROW(read_text_file(target), Error);
  write_file_atomic((dir / "small.txt").string(), "contents\n", true);
  EXPECT_EQ(read_text_file((dir / "small.txt").string()), "contents\n");
}

// Cache::bypass (O_DIRECT in aligned 4 MiB blocks where the file system takes it, moe-replace's plan):
// every byte arrives whatever the sizes of the pieces and of the whole (empty, below a page, a whole
// number of blocks, one past, a tail), and a patch or a hole after direct blocks (which turns
// O_DIRECT off) lands as in a cached file. /dev/shm (tmpfs) is tried too: where it refuses O_DIRECT
// the file is written through the cache.
TEST(AtomicFile, BypassWritesEveryByteWhateverTheSizes) {
  std::vector<fs::path> dirs = {ucpkit::testing::scratch_dir("atomic_bypass")};
  if (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0) {
    dirs.push_back(fs::path("/dev/shm") / ("ucpkit_atomic_bypass_" + std::to_string(::getpid())));
    fs::create_directories(dirs.back());
  }
  std::mt19937 rng(11);
  const size_t block = size_t{4} << 20;
  for (const fs::path& dir : dirs) {
    // Up to more full blocks than wait for the disk at once (three): the caller waits for one written to fill next.
    for (size_t total : {size_t{0}, size_t{100}, size_t{4096}, block, block + 1, 2 * block + 4095, 9 * block / 4 + 123,
                         9 * block + 7}) {
      const fs::path target = dir / ("out" + std::to_string(total) + ".bin");
      std::string expect(total, '\0');
      for (auto& c : expect) c = static_cast<char>(rng());
      {
        AtomicFile f(target.string(), /*durable=*/true, AtomicFile::Cache::bypass);
        for (size_t at = 0; at < total;) {  // pieces from 1 byte to 6 MiB
          const size_t n = std::min<size_t>(total - at, rng() % 3 == 0 ? rng() % 200 + 1 : rng() % (6u << 20) + 1);
          f.write(expect.data() + at, n);
          at += n;
        }
        EXPECT_EQ(f.offset(), total);
        f.start_writeback();
        EXPECT_FALSE(fs::exists(target));
        f.commit();
      }
      EXPECT_EQ(slurp(target), expect) << target;
      EXPECT_EQ(entries(dir), 1u) << "temporary file left beside " << target;
      fs::remove(target);
    }
    // Direct blocks, then a patch into them, a hole and more bytes (through the cache from there).
    const fs::path target = dir / "patched.bin";
    std::string expect(block + 5000, 'd');
    {
      AtomicFile f(target.string(), false, AtomicFile::Cache::bypass);
      f.write(expect.data(), expect.size());
      const std::string patch = "PATCH";
      f.pwrite_at(10, {reinterpret_cast<const uint8_t*>(patch.data()), patch.size()});
      f.skip(100);
      f.write("end", 3);
      expect.replace(10, patch.size(), patch);
      expect += std::string(100, '\0') + "end";
      f.commit();
    }
    EXPECT_EQ(slurp(target), expect);
    // Not committed: nothing left (also with full blocks still waiting for the disk).
    { AtomicFile f((dir / "dropped.bin").string(), true, AtomicFile::Cache::bypass); f.write(expect.data(), expect.size()); }
    {
      AtomicFile f((dir / "dropped.bin").string(), true, AtomicFile::Cache::bypass);
      for (int k = 0; k < 6; ++k) f.write(expect.data(), block);
    }
    EXPECT_FALSE(fs::exists(dir / "dropped.bin"));
    EXPECT_EQ(entries(dir), 1u);
  }
  if (dirs.size() > 1) fs::remove_all(dirs.back());
}

// A bypassed file written as a DCP data file is (records of a few KB, each with a field patched after its data):
// patches inside the block being filled land there, a patch into a block already written (a record across a
// block's end) turns O_DIRECT off; every byte lands either way.
TEST(AtomicFile, BypassPatchesInTheBlockBeingFilledAndInBlocksWritten) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_bypass_patch");
  std::mt19937 rng(5);
  const fs::path target = dir / "records.bin";
  std::string expect;
  {
    AtomicFile f(target.string(), false, AtomicFile::Cache::bypass);
    while (expect.size() < (size_t{9} << 20)) {  // more than two 4 MiB blocks
      const uint64_t header = f.offset();
      f.write("HEADER00", 8);
      std::string data(rng() % 40000 + 1, '\0');
      for (auto& c : data) c = static_cast<char>(rng());
      f.write(data.data(), data.size());
      const std::string field = "C" + std::to_string(rng() % 1000000);
      f.pwrite_at(header + 1, {reinterpret_cast<const uint8_t*>(field.data()), std::min<size_t>(field.size(), 7)});
      std::string head = "HEADER00";
      head.replace(1, std::min<size_t>(field.size(), 7), field.substr(0, 7));
      expect += head + data;
    }
    EXPECT_EQ(f.offset(), expect.size());
    f.commit();
  }
  EXPECT_EQ(slurp(target), expect);
  EXPECT_EQ(entries(dir), 1u);
}

TEST(AtomicFile, RoomFillsTheDirectBlockInPlaceBesideWrites) {
  const fs::path dir = ucpkit::testing::scratch_dir("atomic_room");
  std::mt19937 rng(7);
  const fs::path target = dir / "filled.bin";
  std::string expect;
  size_t in_place = 0;
  {
    AtomicFile f(target.string(), false, AtomicFile::Cache::bypass);
    while (expect.size() < (size_t{10} << 20)) {  // across block ends, some of them not 8-aligned
      const std::string head(rng() % 100 + 1, static_cast<char>('a' + rng() % 26));
      f.write(head.data(), head.size());
      expect += head;
      for (size_t want = rng() % 3000000 + 1; want > 0;) {
        const std::span<uint8_t> room = f.room(want, 8);
        if (room.empty()) {  // the room left in the block is not a multiple of 8: an ordinary write
          const char c = static_cast<char>(rng());
          f.write(&c, 1);
          expect += c;
          --want;
          continue;
        }
        ASSERT_LE(room.size(), want);
        for (auto& c : room) c = static_cast<char>(rng());
        expect.append(reinterpret_cast<const char*>(room.data()), room.size());
        f.filled(room.size());
        in_place += room.size();
        want -= room.size();
      }
      EXPECT_EQ(f.offset(), expect.size());
    }
    f.commit();
  }
  EXPECT_TRUE(in_place == 0 || in_place > expect.size() / 2) << in_place;  // 0: this file system refuses O_DIRECT
  EXPECT_EQ(slurp(target), expect);
  // Through the page cache there is no block to fill: write() it is.
  AtomicFile kept((dir / "kept.bin").string());
  EXPECT_TRUE(kept.room(100).empty());
}

}  // namespace atomic_file_test
