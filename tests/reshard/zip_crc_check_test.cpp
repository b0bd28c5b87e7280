// check_zip_crcs (lib/io/zip/zip_crc_check): the zip CRC-32 check that ucp-load's direct mode
// completes from the pieces it checksummed while copying. Records are written by ZipWriter and
// their expected CRCs are zlib's (independent of our CRC code); the pieces given must really be used
// (a wrong piece CRC is a mismatch even though the file is intact), bytes no piece covers must really
// be read (a flipped byte outside the pieces is found), duplicates, nested and partly overlapping
// pieces must give the right result.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/zip/zip_crc_check.h"
#include "io/zip/zip_reader.h"
#include "io/zip/zip_writer.h"
#include "support/process.h"

namespace zip_crc_check_test {

namespace fs = std::filesystem;
using ucpkit::KnownCrc;

namespace {

struct Fixture {
  std::string path;
  std::vector<uint8_t> data;  // record "archive/data/0"
  uint64_t at = 0;            // its file offset
};

Fixture make(const std::string& name) {
  Fixture f;
  f.path = (fs::path(ucpkit::testing::scratch_dir("zip_crc_" + name)) / "x.pt").string();
  std::mt19937 rng(7);
  f.data.resize(3 << 20);
  for (auto& b : f.data) b = static_cast<uint8_t>(rng());
  ucpkit::ZipWriter w(f.path);
  const std::string pkl = "pickle bytes";
  w.add("archive/data.pkl", {reinterpret_cast<const uint8_t*>(pkl.data()), pkl.size()});
  w.add("archive/data/0", {f.data.data(), f.data.size()});
  w.finish();
  ucpkit::ZipReader z(ucpkit::MappedFile::open(f.path));
  f.at = z.find("data/0")->data_offset;
  return f;
}

// A piece [a, a + n) of the record, with zlib's CRC of the bytes.
KnownCrc piece(const Fixture& f, uint64_t a, uint64_t n) {
  return {f.at + a, n, static_cast<uint32_t>(crc32(0, f.data.data() + a, static_cast<uInt>(n)))};
}

void flip(const Fixture& f, uint64_t offset) {
  std::fstream io(f.path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  io.read(&c, 1);
  c ^= 4;
  io.seekp(static_cast<std::streamoff>(offset));
  io.write(&c, 1);
}

}  // namespace

TEST(ZipCrcCheck, PiecesInAnyOrderAndOverlapsGiveTheRecordsCrc) {
  const Fixture f = make("ok");
  const uint64_t n = f.data.size();
  // No pieces: every record is read whole.
  const uint64_t whole = ucpkit::check_zip_crcs(f.path, {});
  EXPECT_GE(whole, n);
  EXPECT_LT(whole, fs::file_size(f.path));  // records only, not headers or the directory
  // Shuffled, duplicated, nested and partly overlapping pieces; gaps between them.
  std::vector<KnownCrc> known = {piece(f, 1000, 5000), piece(f, 0, 1000), piece(f, 0, 1000), piece(f, 2000, 100),
                                 piece(f, 5000, 4000),  // starts inside [1000, 6000): its rest is read
                                 piece(f, 20000, n - 30000), piece(f, n - 10000, 10000)};
  const uint64_t read = ucpkit::check_zip_crcs(f.path, known);
  // Read: [6000, 9000) (the rest of the piece starting inside [1000, 6000)) and the gap [9000, 20000).
  EXPECT_EQ(read, whole - n + 3000 + 11000);
  // The whole record as one piece.
  EXPECT_EQ(ucpkit::check_zip_crcs(f.path, {piece(f, 0, n)}), whole - n);
}

TEST(ZipCrcCheck, WrongPieceOrDamagedGapIsAMismatchNamingFileAndRecord) {
  const Fixture f = make("bad");
  const uint64_t n = f.data.size();
  KnownCrc wrong = piece(f, 4096, 65536);
  wrong.crc ^= 1;  // the file is intact: only using the piece can fail
  try {
    ucpkit::check_zip_crcs(f.path, {piece(f, 0, 4096), wrong});
    ADD_FAILURE() << "no error";
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("x.pt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CRC-32 mismatch in record 'archive/data/0'"), std::string::npos) << e.what();
  }
  // A byte flipped where no piece covers it (the pieces are those of the intact bytes).
  flip(f, f.at + n / 2);
  EXPECT_THROW(ucpkit::check_zip_crcs(f.path, {piece(f, 0, n / 4), piece(f, 3 * n / 4, n / 4)}), ucpkit::Error);
  // The same flip inside a piece computed from the intact bytes is not seen (the piece is trusted:
  // it is the CRC of what the copy read), which is why pieces must come from the bytes actually read.
  EXPECT_NO_THROW(ucpkit::check_zip_crcs(f.path, {piece(f, 0, n)}));
}

}  // namespace zip_crc_check_test
