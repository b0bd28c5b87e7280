// pec/object_store.h: content-addressed objects on disk. Their file (header by hand: magic, raw size,
// digest, little-endian; the zstd payload decompressed by the zstd command), put and put_stream giving
// the same object, deduplication and trust, the damage get() and put() find, listing, removal and the
// temporaries of interrupted writes.
#include "pec/object_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pec/checksum.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace object_store_test {

namespace fs = std::filesystem;
using namespace ucpkit::pec;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;

namespace {
std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// Compressible but not constant.
std::string sample(size_t n, int salt = 0) {
  std::string s(n, 'x');
  for (size_t i = 0; i < n; i += 7) s[i] = static_cast<char>('a' + (i / 7 + static_cast<size_t>(salt)) % 26);
  return s;
}

uint64_t le64(const std::string& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = v << 8 | static_cast<uint8_t>(b[at + static_cast<size_t>(i)]);
  return v;
}

std::string fresh(const std::string& name) {
  const std::string d = ucpkit::testing::scratch_dir("object-store-" + name);
  fs::create_directories(d + "/objects");  // as Store creates it
  return d;
}

void overwrite(const std::string& path, size_t at, char c) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.seekp(static_cast<std::streamoff>(at));
  io.put(c);
}
}  // namespace

TEST(PecObjectStore, PutWritesAHeaderAndAZstdFrameUnderItsDigest) {
  const std::string dir = fresh("put");
  ObjectStore s(dir);
  const std::string text = sample(100000);
  const ObjectInfo info = s.put(bytes_of(text));
  const Digest d = digest(std::string_view(text));
  EXPECT_EQ(info.id, d.hex());
  EXPECT_EQ(info.digest, d);
  EXPECT_EQ(info.raw_size, text.size());
  EXPECT_FALSE(info.existed);
  const std::string path = dir + "/objects/" + info.id.substr(0, 2) + "/" + info.id;
  EXPECT_EQ(s.path_of(info.id), path);
  EXPECT_TRUE(s.exists(info.id));
  const std::string file = file_bytes(path);
  EXPECT_EQ(info.stored_size, file.size());
  EXPECT_LT(file.size(), text.size() / 4);  // compressed
  EXPECT_EQ(file.substr(0, 8), "UCPKOBJ1");
  EXPECT_EQ(le64(file, 8), text.size());
  EXPECT_EQ(le64(file, 16), d.hi);
  EXPECT_EQ(le64(file, 24), d.lo);
  // The payload is one zstd frame of the bytes.
  std::ofstream(dir + "/payload.zst", std::ios::binary) << file.substr(32);
  ASSERT_EQ(ucpkit::testing::run_command("zstd -q -d -f " + dir + "/payload.zst -o " + dir + "/payload"), 0);
  EXPECT_TRUE(file_bytes(dir + "/payload") == text);
  EXPECT_EQ(s.get(info.id, text.size()), bytes_of(text));

  // The same bytes again: found, not written.
  const auto before = fs::last_write_time(path);
  const ObjectInfo again = s.put(bytes_of(text));
  EXPECT_TRUE(again.existed);
  EXPECT_EQ(again.id, info.id);
  EXPECT_EQ(again.stored_size, info.stored_size);
  EXPECT_EQ(fs::last_write_time(path), before);
  s.sync_dirs();
  EXPECT_EQ(s.list(), std::vector<std::string>{info.id});
}

TEST(PecObjectStore, LevelZeroStoresTheBytesAsTheyAre) {
  const std::string dir = fresh("raw");
  ObjectStore s(dir, 0);
  const std::string text = sample(5000);
  const ObjectInfo info = s.put(bytes_of(text));
  const std::string file = file_bytes(s.path_of(info.id));
  EXPECT_EQ(file.size(), 32u + text.size());
  EXPECT_EQ(file.substr(0, 8), "UCPKOBJ0");
  EXPECT_TRUE(file.substr(32) == text);
  std::vector<uint8_t> out(text.size());
  s.get_into(info.id, text.size(), out.data());
  EXPECT_EQ(out, bytes_of(text));

  // A raw object one byte short is refused for its size.
  fs::resize_file(s.path_of(info.id), file.size() - 1);
  const std::string e = error_of([&] { s.get(info.id, text.size()); });
  EXPECT_EQ(e, s.path_of(info.id) + ": corrupt object (stored size differs)");
}

TEST(PecObjectStore, EmptyObjectRoundTrips) {
  ObjectStore s(fresh("empty"));
  const ObjectInfo info = s.put({});
  EXPECT_EQ(info.raw_size, 0u);
  EXPECT_EQ(info.id, digest(std::string_view()).hex());
  EXPECT_TRUE(s.get(info.id, 0).empty());
  const ObjectInfo streamed = s.put_stream(0, [](uint64_t, size_t, uint8_t*) { FAIL() << "nothing to read"; });
  EXPECT_EQ(streamed.id, info.id);
  EXPECT_TRUE(streamed.existed);
}

TEST(PecObjectStore, StreamedObjectIsThePutObjectReadInBlocksInOrder) {
  const std::string text = sample(ObjectStore::kStreamBlock * 5 / 2, 3);  // 2.5 blocks
  for (int level : {0, 3}) {
    SCOPED_TRACE(level);
    const std::string a = fresh("stream-a" + std::to_string(level)), b = fresh("stream-b" + std::to_string(level));
    ObjectStore streamed(a, level), whole(b, level);
    std::vector<std::pair<uint64_t, size_t>> reads;
    const ObjectInfo si = streamed.put_stream(text.size(), [&](uint64_t off, size_t n, uint8_t* dst) {
      reads.emplace_back(off, n);
      std::memcpy(dst, text.data() + off, n);
    });
    const size_t k = ObjectStore::kStreamBlock;
    EXPECT_EQ(reads, (std::vector<std::pair<uint64_t, size_t>>{{0, k}, {k, k}, {2 * k, k / 2}}));
    const ObjectInfo wi = whole.put(bytes_of(text));
    EXPECT_EQ(si.id, wi.id);
    EXPECT_EQ(si.raw_size, text.size());
    EXPECT_EQ(streamed.get(si.id, text.size()), bytes_of(text));
    if (level == 0) EXPECT_TRUE(file_bytes(streamed.path_of(si.id)) == file_bytes(whole.path_of(wi.id)));
    EXPECT_EQ(si.stored_size, fs::file_size(streamed.path_of(si.id)));
    // Again: the temporary copy is dropped, nothing is left but the object.
    EXPECT_TRUE(streamed
                    .put_stream(text.size(),
                                [&](uint64_t off, size_t n, uint8_t* dst) { std::memcpy(dst, text.data() + off, n); })
                    .existed);
    EXPECT_EQ(streamed.remove_temporaries(), 0u);
    EXPECT_EQ(streamed.list(), std::vector<std::string>{si.id});
  }
}

TEST(PecObjectStore, HeaderMustNameTheObjectAndItsSize) {
  ucpkit::formats::ObjectHeader h;
  const Digest d = digest(std::string_view("abc"));
  h.raw_size = 3;
  h.digest_hi = d.hi;
  h.digest_lo = d.lo;
  EXPECT_EQ(error_of([&] { check_object_header(h, d.hex(), 3, "o"); }), "");
  EXPECT_EQ(error_of([&] { check_object_header(h, d.hex(), 4, "o"); }), "o: size 3 differs from the manifest's 4");
  EXPECT_EQ(error_of([&] { check_object_header(h, std::string(32, '0'), 3, "o"); }),
            "o: header checksum does not match the object id");
  EXPECT_THROW(check_object_header(h, d.hex(), 4, "o"), ObjectError);
}

TEST(PecObjectStore, GetRefusesMissingMisnamedAndDamagedObjects) {
  const std::string dir = fresh("damage");
  ObjectStore s(dir);
  const std::string text = sample(20000), other = sample(20000, 5);
  const ObjectInfo a = s.put(bytes_of(text)), b = s.put(bytes_of(other));
  const std::string pa = s.path_of(a.id);

  EXPECT_EQ(error_of([&] { s.get(std::string(32, 'f'), 1); }), s.path_of(std::string(32, 'f')) + ": object missing");
  EXPECT_EQ(error_of([&] { s.get(a.id, 7); }), pa + ": size 20000 differs from the manifest's 7");

  // Object b's file at a's name: its header names b.
  const std::string saved = file_bytes(pa);
  fs::copy_file(s.path_of(b.id), pa, fs::copy_options::overwrite_existing);
  EXPECT_EQ(error_of([&] { s.get(a.id, text.size()); }), pa + ": header checksum does not match the object id");
  // A bad magic.
  std::ofstream(pa, std::ios::binary | std::ios::trunc) << saved;
  overwrite(pa, 0, 'X');
  EXPECT_EQ(error_of([&] { s.get(a.id, text.size()); }), pa + ": not a PEC object (bad header)");
  // A flipped payload byte.
  std::ofstream(pa, std::ios::binary | std::ios::trunc) << saved;
  overwrite(pa, saved.size() - 5, '\x7f');
  const std::string e = error_of([&] { s.get(a.id, text.size()); });
  EXPECT_EQ(e.rfind(pa + ": corrupt object", 0), 0u) << e;
  EXPECT_THROW(s.get(a.id, text.size()), ObjectError);
  EXPECT_EQ(s.get(b.id, other.size()), bytes_of(other));  // the others untouched
}

TEST(PecObjectStore, DamagedTrustedObjectIsRewrittenAndReported) {
  const std::string dir = fresh("repair");
  const std::string text = sample(30000);
  std::string id, path;
  {
    ObjectStore s(dir);
    id = s.put(bytes_of(text)).id;
    path = s.path_of(id);
  }
  overwrite(path, 40, '\0');
  ObjectStore s(dir);
  EXPECT_TRUE(s.repaired().empty());
  const ObjectInfo info = s.put(bytes_of(text));
  EXPECT_FALSE(info.existed);  // written again
  ASSERT_EQ(s.repaired().size(), 1u);
  EXPECT_EQ(s.repaired()[0].rfind(path + ": ", 0), 0u) << s.repaired()[0];
  EXPECT_EQ(s.get(id, text.size()), bytes_of(text));
}

TEST(PecObjectStore, OnlyTrustedObjectsAreReused) {
  const std::string dir = fresh("trust");
  const std::string text = sample(3000);
  const std::string id = ObjectStore(dir).put(bytes_of(text)).id;
  ObjectStore s(dir);
  s.trust({});
  EXPECT_FALSE(s.put(bytes_of(text)).existed);  // a leftover no manifest names: rewritten
  EXPECT_TRUE(s.put(bytes_of(text)).existed);   // what this process wrote is trusted
  ObjectStore t(dir);
  t.trust({id});
  EXPECT_TRUE(t.put(bytes_of(text)).existed);
  EXPECT_TRUE(t.repaired().empty());
}

TEST(PecObjectStore, ListRemoveAndTemporaries) {
  const std::string dir = fresh("list");
  ObjectStore s(dir);
  EXPECT_TRUE(ObjectStore(dir + "/none").list().empty());
  EXPECT_EQ(ObjectStore(dir + "/none").remove_temporaries(), 0u);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(s.put(bytes_of(sample(100, i))).id);
  const std::string sub = fs::path(s.path_of(ids[0])).parent_path().string();
  std::ofstream(sub + "/" + ids[0] + ".tmp.123.1") << "x";  // put()'s temporary
  std::ofstream(dir + "/objects/.put.tmp.123.2") << "x";    // put_stream()'s
  std::ofstream(sub + "/short") << "x";                     // no object name
  std::vector<std::string> listed = s.list();
  std::sort(listed.begin(), listed.end());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(listed, ids);
  EXPECT_EQ(s.remove_temporaries(), 2u);
  EXPECT_FALSE(fs::exists(dir + "/objects/.put.tmp.123.2"));
  EXPECT_TRUE(fs::exists(sub + "/short"));
  s.remove(ids[1]);
  EXPECT_FALSE(s.exists(ids[1]));
  s.remove(ids[1]);  // already gone: nothing to do
  EXPECT_EQ(s.list().size(), 2u);
}

}  // namespace object_store_test
