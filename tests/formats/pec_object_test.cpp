// formats/pec_object: the PEC store's object file (docs/pec.md "32-byte header (UCPKOBJ1, raw size,
// digest) + one zstd frame ..., or with --zstd-level 0 UCPKOBJ0 + the bytes as they are"). The header is
// checked against its documented byte layout; ObjectReader reads objects pec's ObjectStore wrote (the
// store's writer) and refuses damaged ones, naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/pec_object.h"
#include "pec/object_store.h"
#include "support/errors.h"
#include "support/process.h"

namespace pec_object_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using formats::ObjectHeader;
using formats::ObjectReader;

namespace {

std::vector<uint8_t> payload(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 7) ^ (i >> 9));  // compressible, not constant
  return v;
}

std::vector<uint8_t> read_all(ObjectReader& r) {
  std::vector<uint8_t> out;
  r.read([&](const uint8_t* d, size_t n) { out.insert(out.end(), d, d + n); });
  return out;
}

std::string bytes_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

// The message ObjectReader throws (ObjectError) opening and reading `path`; empty when it reads it.
std::string read_error(const std::string& path) {
  ObjectReader r;
  return ucpkit::testing::error_of([&] {
    r.open(path);
    (void)read_all(r);
  });
}

}  // namespace

TEST(PecObject, HeaderLayoutIsTheDocumentedOne) {
  const ObjectHeader h{false, 0x0102030405060708ull, 0x1112131415161718ull, 0x2122232425262728ull};
  const auto b = h.encode();
  const std::string magic(reinterpret_cast<const char*>(b.data()), 8);
  EXPECT_EQ(magic, "UCPKOBJ1");
  EXPECT_EQ(b[8], 0x08);   // raw size, little-endian
  EXPECT_EQ(b[15], 0x01);
  EXPECT_EQ(b[16], 0x18);  // digest hi
  EXPECT_EQ(b[31], 0x21);  // digest lo, last byte
  const ObjectHeader stored{true, 5, 6, 7};
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(stored.encode().data()), 8), "UCPKOBJ0");
}

TEST(PecObject, HeaderRoundTrips) {
  for (const ObjectHeader& h : {ObjectHeader{false, 0, 0, 0}, ObjectHeader{true, 1ull << 40, ~0ull, 42},
                                ObjectHeader{false, 123456789, 0x8000000000000000ull, 1}}) {
    const auto b = h.encode();
    const ObjectHeader back = ObjectHeader::parse(b, "x");
    EXPECT_EQ(back.stored, h.stored);
    EXPECT_EQ(back.raw_size, h.raw_size);
    EXPECT_EQ(back.digest_hi, h.digest_hi);
    EXPECT_EQ(back.digest_lo, h.digest_lo);
  }
}

TEST(PecObject, DamagedHeadersAreRefusedNamingTheFile) {
  auto b = ObjectHeader{false, 9, 1, 2}.encode();
  const auto error_of = [](std::span<const uint8_t> bytes) {
    return ucpkit::testing::error_of([&] { (void)ObjectHeader::parse(bytes, "/store/objects/ab/abcd"); });
  };
  EXPECT_EQ(error_of({b.data(), 31}), "/store/objects/ab/abcd: not a PEC object (bad header)");  // short
  EXPECT_EQ(error_of({}), "/store/objects/ab/abcd: not a PEC object (bad header)");
  b[7] = '2';  // "UCPKOBJ2"
  EXPECT_EQ(error_of(b), "/store/objects/ab/abcd: not a PEC object (bad header)");

  const std::string dir = ucpkit::testing::scratch_dir("pec_object_headers");
  write_file(dir + "/short", "UCPKOBJ1\x01");
  EXPECT_EQ(read_error(dir + "/short"), dir + "/short: not a PEC object (bad header)");
  EXPECT_EQ(read_error(dir + "/none"), dir + "/none: object missing");
}

// Objects as the store writes them, compressed and stored, read back byte for byte; the header
// names the store's id (its digest) and size.
TEST(PecObject, ReadsWhatTheStoreWrites) {
  for (int level : {3, 0}) {
    SCOPED_TRACE("zstd level " + std::to_string(level));
    const std::string dir = ucpkit::testing::scratch_dir("pec_object_store_" + std::to_string(level));
    pec::ObjectStore store(dir, level);
    const auto bytes = payload((size_t{9} << 20) + 3);  // more than two windows
    const auto info = store.put(bytes);
    ObjectReader r;
    const ObjectHeader h = r.open(store.path_of(info.id));
    EXPECT_EQ(h.stored, level == 0);
    EXPECT_EQ(h.raw_size, bytes.size());
    EXPECT_EQ((pec::Digest{h.digest_hi, h.digest_lo}.hex()), info.id);
    EXPECT_EQ(read_all(r), bytes);
    EXPECT_NO_THROW(pec::check_object_header(h, info.id, bytes.size(), "p"));
    EXPECT_NE(ucpkit::testing::error_of([&] { pec::check_object_header(h, info.id, 7, "p"); }).find("differs from the manifest's 7"),
              std::string::npos);
  }
}

TEST(PecObject, DamagedPayloadsAreRefusedNamingTheFile) {
  const std::string dir = ucpkit::testing::scratch_dir("pec_object_damaged");
  const auto bytes = payload(300000);
  pec::ObjectStore zstd(dir + "/z", 3), stored(dir + "/s", 0);
  const std::string z = bytes_of_file(zstd.path_of(zstd.put(bytes).id));
  const std::string s = bytes_of_file(stored.path_of(stored.put(bytes).id));

  const auto expect = [&](const std::string& name, const std::string& file_bytes, const std::string& cause) {
    const std::string path = dir + "/" + name;
    write_file(path, file_bytes);
    const std::string e = read_error(path);
    EXPECT_EQ(e.rfind(path + ": ", 0), 0u) << e;
    EXPECT_NE(e.find(cause), std::string::npos) << name << ": " << e;
  };
  expect("truncated_frame", z.substr(0, z.size() - 10), "corrupt object (truncated zstd frame)");
  expect("after_frame", z + "x", "corrupt object (bytes after the zstd frame)");
  std::string flipped = z;
  flipped[32] = static_cast<char>(flipped[32] ^ 0x5a);  // the zstd frame's magic number
  expect("flipped", flipped, "corrupt object");
  expect("stored_short", s.substr(0, s.size() - 1), "corrupt object (decompressed to 299999 bytes)");
  expect("stored_long", s + "x", "corrupt object (decompresses to more than its size)");
}

}  // namespace pec_object_test
