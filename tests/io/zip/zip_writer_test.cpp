// lib/io/zip/zip_writer: zips written by ZipWriter (plain, multi-part, streamed, reserved, appended to a
// larger file, ZIP64 by size, offset and record count) read back by an independent reader, /usr/bin/python3's
// zipfile (names, bytes, CRC-32s, dates, 64-byte data alignment), plus a local header checked byte by byte
// and the writer's refusals.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/zip/zip_writer.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace zip_zip_writer_test {

using namespace ucpkit;
using namespace std::string_view_literals;

namespace {

std::span<const uint8_t> span_of(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

std::string hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string h;
  for (unsigned char c : s) h += {d[c >> 4], d[c & 15]};
  return h;
}

// Python's zipfile checks `path` against `want` (name -> bytes, in order; a bytes value of "*N" means a
// record of N bytes not read back) and, with `testzip`, every CRC-32. Returns its output.
std::string python_check(const std::string& path, const std::vector<std::pair<std::string, std::string>>& want,
                         bool testzip = true) {
  const std::string list = path + ".want";
  {
    std::ofstream o(list);
    for (const auto& [n, b] : want) o << n << " " << (b.rfind('*', 0) == 0 ? b : "=" + hex(b)) << "\n";
  }
  const std::string script = path + ".py";
  std::ofstream(script) << R"PY(
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
want = [l.split(' ') for l in open(sys.argv[2]).read().splitlines()]
infos = z.infolist()
assert [i.filename for i in infos] == [w[0] for w in want], [i.filename for i in infos]
for info, (name, data) in zip(infos, want):
    assert info.compress_type == zipfile.ZIP_STORED, name
    assert info.date_time == (1980, 1, 1, 0, 0, 0), info.date_time
    if data.startswith('*'):
        assert info.file_size == int(data[1:]), (name, info.file_size)
    else:
        assert z.read(name).hex() == data[1:], name
if sys.argv[3] == '1':
    assert z.testzip() is None
print('ok', len(infos))
)PY";
  std::string out;
  const int rc = ucpkit::testing::run_command(
      std::string(UCPKIT_PYTHON) + " " + script + " " + path + " " + list + " " + (testzip ? "1" : "0"), &out);
  return rc == 0 ? out : "failed (" + std::to_string(rc) + "): " + out;
}

// Every record's data starts at a multiple of 64 from the zip's start (`base` bytes into the file):
// from each local header, 30 + name length + extra length.
void expect_aligned(const std::string& path, uint64_t base = 0) {
  const std::string b = ucpkit::testing::file_bytes(path);
  size_t n = 0;
  for (size_t at = b.find("PK\x03\x04"sv, base); at != std::string::npos; at = b.find("PK\x03\x04"sv, at + 4)) {
    const auto u16 = [&](size_t o) { return static_cast<uint8_t>(b[o]) | static_cast<uint8_t>(b[o + 1]) << 8; };
    const uint64_t data = at + 30 + u16(at + 26) + u16(at + 28);
    EXPECT_EQ((data - base) % 64, 0u) << "record at " << at;
    ++n;
  }
  EXPECT_GT(n, 0u);
}

}  // namespace

TEST(ZipWriter, LocalHeaderBytesByHand) {
  const std::string path = ucpkit::testing::scratch_dir("zip_writer_header") + "/h.zip";
  ZipWriter z(path);
  z.add("a/x", span_of("hello"sv));
  z.finish();
  const std::string b = ucpkit::testing::file_bytes(path);
  // signature, version 20, flags 0, stored, time 0, date 1980-01-01 (0x0021), CRC-32("hello") =
  // 0x3610a686, sizes 5 and 5, name length 3, extra length 31 (4 + 27 padding: data at 64).
  EXPECT_EQ(hex(b.substr(0, 30)),
            "504b0304"
            "1400"
            "0000"
            "0000"
            "0000"
            "2100"
            "86a61036"
            "05000000"
            "05000000"
            "0300"
            "1f00");
  EXPECT_EQ(b.substr(30, 3), "a/x");
  EXPECT_EQ(hex(b.substr(33, 4)),
            "4642"
            "1b00");  // "FB" padding field of 27 bytes
  EXPECT_EQ(b.substr(37, 27), std::string(27, 'Z'));
  EXPECT_EQ(b.substr(64, 5), "hello");
  // End of central directory: 1 record, no ZIP64.
  const size_t eocd = b.rfind("PK\x05\x06"sv);
  ASSERT_NE(eocd, std::string::npos);
  EXPECT_EQ(eocd + 22, b.size());
  EXPECT_EQ(hex(b.substr(eocd + 8, 4)),
            "0100"
            "0100");
  EXPECT_EQ(b.find("PK\x06\x06"sv), std::string::npos);
}

TEST(ZipWriter, RecordsOfEveryKindReadBackByPythonZipfile) {
  const std::string dir = ucpkit::testing::scratch_dir("zip_writer_kinds");
  const std::string path = dir + "/k.zip";
  std::string streamed(10000, '\0');
  for (size_t k = 0; k < streamed.size(); ++k) streamed[k] = static_cast<char>((k * 7) & 0xff);
  const std::string reserved = "0123456789abcdefghij";
  std::vector<std::pair<uint64_t, size_t>> windows;
  {
    ZipWriter z(path);
    z.add("p/empty", span_of(""sv));
    z.add("p/parts", {span_of("ab"sv), span_of(""sv), span_of("cde"sv)});
    ZipWriter::set_stream_window(4096);
    z.add_streamed(
        "p/streamed", streamed.size(),
        [&](uint64_t off, std::span<uint8_t> w) {
          windows.emplace_back(off, w.size());
          std::copy_n(streamed.data() + off, w.size(), w.data());
        },
        3);
    ZipWriter::set_stream_window(8u << 20);
    const size_t r = z.reserve("p/reserved", reserved.size());
    z.add("p/after", span_of("tail"sv));
    z.flush();
    z.write_reserved(r, 10, span_of(std::string_view(reserved).substr(10)));  // out of order
    z.write_reserved(r, 0, span_of(std::string_view(reserved).substr(0, 10)));
    z.set_crc(r, 0x638c0d29);  // zlib.crc32(b'0123456789abcdefghij')
    EXPECT_FALSE(std::filesystem::exists(path)) << "written under a temporary name until finish()";
    z.finish();
  }
  // Windows of whole 3-byte elements: 4095 bytes (4096 rounded down to the alignment), then the rest.
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0], (std::pair<uint64_t, size_t>{0, 4095}));
  EXPECT_EQ(windows[1], (std::pair<uint64_t, size_t>{4095, 4095}));
  EXPECT_EQ(windows[2], (std::pair<uint64_t, size_t>{8190, 1810}));
  EXPECT_EQ(python_check(path, {{"p/empty", ""},
                                {"p/parts", "abcde"},
                                {"p/streamed", streamed},
                                {"p/reserved", reserved},
                                {"p/after", "tail"}}),
            "ok 5\n");
  expect_aligned(path);
  for (const auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_TRUE(e.path().filename() == "k.zip" || e.path().extension() != ".zip") << e.path();
}

// A record of zeros (a fresh run's optimizer moments) is a hole of the file: Python's zipfile reads its zeros and
// checks their CRC-32 (computed, not summed), the records after it are in place, and where the file system keeps
// holes the file takes less room than its size.
TEST(ZipWriter, ARecordOfZerosIsAHoleReadBackAsZeros) {
  const std::string dir = ucpkit::testing::scratch_dir("zip_writer_zeros");
  const std::string path = dir + "/z.zip";
  const size_t n = size_t{4} << 20;
  {
    ZipWriter z(path);
    z.add("z/data.pkl", span_of("pickle"sv));
    z.add_zeros("z/data/0", n);
    z.add_zeros("z/data/1", 0);
    z.add("z/after", span_of("tail"sv));
    z.finish();
  }
  EXPECT_EQ(python_check(path, {{"z/data.pkl", "pickle"}, {"z/data/0", std::string(n, '\0')}, {"z/data/1", ""}, {"z/after", "tail"}}),
            "ok 4\n");
  expect_aligned(path);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  // A probe: does this file system keep a hole of the same size?
  const std::string probe = dir + "/probe";
  {
    std::ofstream(probe, std::ios::binary).close();
    std::filesystem::resize_file(probe, n);
  }
  struct stat ps {};
  ASSERT_EQ(::stat(probe.c_str(), &ps), 0);
  if (static_cast<uint64_t>(ps.st_blocks) * 512 < n / 2)
    EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, n / 2) << "the zeros were written, not left as a hole";
}

TEST(ZipWriter, ZipAppendedInsideALargerFileCountsOffsetsFromItsStart) {
  const std::string path = ucpkit::testing::scratch_dir("zip_writer_append") + "/item.bin";
  {
    AtomicFile out(path);
    out.write(span_of("0123456789abc"sv));  // 13 bytes before the zip
    ZipWriter z(out);
    z.add("i/data.pkl", span_of("pickle"sv));
    z.add_streamed("i/data/0", 8, [](uint64_t, std::span<uint8_t> w) { std::fill(w.begin(), w.end(), 0x41); });
    z.finish();
    EXPECT_FALSE(std::filesystem::exists(path)) << "the caller commits";
    out.commit();
  }
  const std::string b = ucpkit::testing::file_bytes(path);
  // The zip alone (its first byte at 13), as a DCP reader slices it out.
  const std::string alone = ucpkit::testing::scratch_dir("zip_writer_append_alone") + "/z.zip";
  std::ofstream(alone, std::ios::binary) << b.substr(13);
  EXPECT_EQ(python_check(alone, {{"i/data.pkl", "pickle"}, {"i/data/0", "AAAAAAAA"}}), "ok 2\n");
  expect_aligned(path, 13);
  // The central directory's offset of the first record is 0: counted from the zip's start.
  const size_t cd = b.find("PK\x01\x02"sv);
  ASSERT_NE(cd, std::string::npos);
  EXPECT_EQ(hex(b.substr(cd + 42, 4)), "00000000");
}

TEST(ZipWriter, Zip64ForARecordOver4GiBAndTheRecordsAfterIt) {
  // A 5 GiB reserved record is a hole in a sparse file (nothing written); zipfile reads the directory
  // (ZIP64 sizes and offsets) and the small record after it, not the hole.
  const std::string dir = ucpkit::testing::scratch_dir("zip_writer_zip64");
  const std::string path = dir + "/big.zip";
  const uint64_t big = 5ull << 30;
  {
    ZipWriter z(path);
    z.add("b/first", span_of("1"sv));
    z.reserve("b/huge", big);
    z.add("b/after", span_of("xyz"sv));
    z.finish();
  }
  EXPECT_EQ(python_check(path, {{"b/first", "1"}, {"b/huge", "*" + std::to_string(big)}, {"b/after", "xyz"}}, false),
            "ok 3\n");
  std::ifstream f(path, std::ios::binary);  // the tail only: the file is 5 GiB (sparse)
  f.seekg(-200, std::ios::end);
  std::string end(200, '\0');
  f.read(end.data(), 200);
  EXPECT_NE(end.find("PK\x06\x06"sv), std::string::npos) << "ZIP64 end of central directory";
  EXPECT_NE(end.find("PK\x06\x07"sv), std::string::npos) << "ZIP64 locator";
  std::filesystem::remove(path);
}

TEST(ZipWriter, Zip64EndRecordFor65535Records) {
  const std::string path = ucpkit::testing::scratch_dir("zip_writer_many") + "/many.zip";
  std::vector<std::pair<std::string, std::string>> want;
  {
    ZipWriter z(path);
    for (int k = 0; k < 0xFFFF; ++k) {
      const std::string name = "m/" + std::to_string(k);
      const std::string data = std::to_string(k * 3);
      z.add(name, span_of(data));
      if (k % 4096 == 0 || k == 0xFFFE) want.emplace_back(name, data);
    }
    z.finish();
  }
  const std::string b = ucpkit::testing::file_bytes(path);
  const size_t eocd = b.rfind("PK\x05\x06"sv);
  ASSERT_NE(eocd, std::string::npos);
  EXPECT_EQ(hex(b.substr(eocd + 8, 4)),
            "ffff"
            "ffff");  // counts in the ZIP64 record
  ASSERT_NE(b.find("PK\x06\x06"sv, eocd - 100), std::string::npos);
  // zipfile reads all 65535 names; the check covers a sample of contents.
  const std::string script = path + ".py";
  std::ofstream(script) << "import sys, zipfile\nz = zipfile.ZipFile(sys.argv[1])\nn = z.namelist()\n"
                           "assert len(n) == 65535 and n[0] == 'm/0' and n[-1] == 'm/65534'\n"
                           "assert z.read('m/65534') == b'196602' and z.read('m/4096') == b'12288'\nprint('ok')\n";
  std::string out;
  EXPECT_EQ(ucpkit::testing::run_command(std::string(UCPKIT_PYTHON) + " " + script + " " + path, &out), 0) << out;
}

TEST(ZipWriter, ReservedRecordsRefuseWritesOutsideThem) {
  const std::string path = ucpkit::testing::scratch_dir("zip_writer_refusals") + "/r.zip";
  ZipWriter z(path);
  const size_t r = z.reserve("r/x", 8);
  z.add("r/plain", span_of("p"sv));
  auto thrown = [](const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); };
  EXPECT_EQ(thrown([&] { z.write_reserved(r, 5, span_of("abcd"sv)); }),
            "zip record r/x: write outside its reserved bytes");
  EXPECT_EQ(thrown([&] { z.write_reserved(r, 9, span_of(""sv)); }), "zip record r/x: write outside its reserved bytes");
  EXPECT_EQ(thrown([&] { z.write_reserved(1, 0, span_of("a"sv)); }),
            "zip record r/plain: write outside its reserved bytes");
  EXPECT_EQ(thrown([&] { z.set_crc(1, 0); }), "zip record r/plain: not a reserved record");
  EXPECT_THROW(z.set_crc(7, 0), std::out_of_range);
  EXPECT_NO_THROW(z.write_reserved(r, 4, span_of("abcd"sv)));  // the last four bytes: inside
}

TEST(ZipWriter, AbandonedWriterLeavesNoFile) {
  const std::string dir = ucpkit::testing::scratch_dir("zip_writer_abandoned");
  {
    ZipWriter z(dir + "/a.zip");
    z.add("a/x", span_of("data"sv));
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

}  // namespace zip_zip_writer_test
