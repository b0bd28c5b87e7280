// lib/io/zip/zip_directory: the records of real zip files (a torch.save file, a ZIP64 directory of
// 70,000 entries, ZIP64 local headers, a ZIP64 central extra field) against Python's own zipfile
// reader (tests/io/zip_fixtures.py), and the refusals: a short ZIP64 field, a compressed record, a name
// given twice, every cut, every damaged directory byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/mapped_file.h"
#include "io/zip/zip_directory.h"
#include "support/errors.h"

namespace zip_directory_test {

using namespace ucpkit;

namespace {

// Written by tests/io/fixtures.py (zip_fixtures.py), the io area's ctest fixture.
std::string fixtures() { return std::string(UCPKIT_FIXTURES_DIR) + "/zip"; }

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void expect_matches_python(const std::string& file) {
  std::ifstream in(fixtures() + "/truth.json");
  const nlohmann::json truth = nlohmann::json::parse(in).at(file);
  const std::vector<uint8_t> data = bytes_of(fixtures() + "/" + file);
  const auto records = read_zip_directory(data, file);
  ASSERT_EQ(records.size(), truth.at("count").get<size_t>()) << file;
  for (const auto& [name, t] : truth.at("records").items()) {
    auto it = records.find(name);
    ASSERT_NE(it, records.end()) << file << ": " << name;
    const ZipRecord& r = it->second;
    EXPECT_EQ(r.data_offset, t.at("data_offset").get<uint64_t>()) << file << ": " << name;
    EXPECT_EQ(r.size, t.at("size").get<uint64_t>()) << file << ": " << name;
    EXPECT_EQ(r.crc32, t.at("crc32").get<uint32_t>()) << file << ": " << name;
    EXPECT_EQ(r.local_header, t.at("local_header").get<uint64_t>()) << file << ": " << name;
    // The central entry: its signature, then the name at byte 46.
    ASSERT_LE(r.central_entry + 46 + name.size(), data.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(&data[r.central_entry]), 4), std::string("PK\1\2"));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(&data[r.central_entry + 46]), name.size()), name);
  }
}

std::string refusal(const std::vector<uint8_t>& data, const std::string& name) {
  return ucpkit::testing::error_of([&] { (void)read_zip_directory(data, name); });
}

}  // namespace

TEST(ZipDirectory, TorchSaveFileAgreesWithPythonZipfile) {
  expect_matches_python("torch.pt");
  EXPECT_TRUE(looks_like_zip(bytes_of(fixtures() + "/torch.pt")));
}

TEST(ZipDirectory, Zip64EndOfDirectoryAgreesWithPythonZipfile) { expect_matches_python("many.zip"); }

TEST(ZipDirectory, Zip64LocalHeadersAgreeWithPythonZipfile) { expect_matches_python("zip64_local.zip"); }

// A central entry whose sizes and local header offset live in a ZIP64 extra field (every record past
// 4 GiB in a large optimizer shard).
TEST(ZipDirectory, Zip64CentralExtraFieldAgreesWithPythonZipfile) { expect_matches_python("zip64_central.zip"); }

TEST(ZipDirectory, ShortZip64FieldIsRefused) {
  const std::string e = refusal(bytes_of(fixtures() + "/zip64_central_short.zip"), "short.zip");
  EXPECT_NE(e.find("zip: short ZIP64 field in entry 'p0'"), std::string::npos) << e;
}

TEST(ZipDirectory, CompressedRecordIsRefusedByName) {
  const std::string e = refusal(bytes_of(fixtures() + "/deflated.zip"), "deflated.zip");
  EXPECT_NE(e.find("deflated.zip: zip: record 'packed' is compressed (method 8)"), std::string::npos) << e;
}

TEST(ZipDirectory, NameGivenTwiceIsRefused) {
  const std::string e = refusal(bytes_of(fixtures() + "/duplicate.zip"), "duplicate.zip");
  EXPECT_NE(e.find("zip: record 'same' appears twice"), std::string::npos) << e;
}

// Cutting the file anywhere is refused: the end of central directory record is the last 22 bytes.
TEST(ZipDirectory, EveryCutOfTheFileIsRefused) {
  const std::vector<uint8_t> data = bytes_of(fixtures() + "/torch.pt");
  uint64_t dir = data.size();
  for (const auto& [name, r] : read_zip_directory(data, "torch.pt")) dir = std::min(dir, r.central_entry);
  ASSERT_LT(dir, data.size());
  for (size_t n = 0; n < data.size(); n += (n < dir ? 97 : 1)) {
    const std::vector<uint8_t> cut(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(refusal(cut, "cut.pt"), "") << "accepted a cut to " << n << " of " << data.size() << " bytes";
  }
  EXPECT_FALSE(looks_like_zip({data.data(), 3}));
}

// Every byte of the central directory and the end record of a torch file damaged (two ways): the
// parse is refused, or every record it returns lies inside the file (what the readers then index
// without further checks). Bytes taken out of the data: the directory no longer lies where the end
// record says, refused.
TEST(ZipDirectory, DamagedDirectoryIsRefusedOrStaysInsideTheFile) {
  const std::vector<uint8_t> data = bytes_of(fixtures() + "/torch.pt");
  uint64_t dir = data.size();
  for (const auto& [name, r] : read_zip_directory(data, "torch.pt")) dir = std::min(dir, r.central_entry);
  size_t refused = 0, parsed = 0;
  for (size_t at = dir; at < data.size(); ++at) {
    for (const uint8_t v : {uint8_t{0xFF}, static_cast<uint8_t>(data[at] ^ 0x7F)}) {
      std::vector<uint8_t> bad = data;
      bad[at] = v;
      try {
        for (const auto& [name, r] : read_zip_directory(bad, "bad.pt")) {
          EXPECT_LE(r.data_offset + r.size, bad.size()) << "byte " << at << ": " << name;
          EXPECT_LE(r.local_header + 30, bad.size()) << "byte " << at << ": " << name;
          EXPECT_LE(r.central_entry + 46, bad.size()) << "byte " << at << ": " << name;
        }
        ++parsed;
      } catch (const Error&) {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, 50u);  // signatures, counts, offsets, name lengths
  EXPECT_GT(parsed, 0u);    // CRCs, times, flags are not the parser's to judge
  std::vector<uint8_t> shorter = data;
  shorter.erase(shorter.begin() + 100, shorter.begin() + 200);
  EXPECT_NE(refusal(shorter, "shorter.pt"), "");
}

}  // namespace zip_directory_test
