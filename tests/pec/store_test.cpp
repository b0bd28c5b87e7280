// The PEC store without a checkpoint: objects round-trip and detect damage, manifests carry a
// checksum, commits are what committed_steps() sees, garbage collection keeps what restores need.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pec/store.h"

namespace store_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::pec;

namespace {
std::string fresh(const std::string& name) {
  std::string d = std::string(UCPKIT_BUILD_DIR) + "/pec-scratch/store_" + name;
  fs::remove_all(d);
  return d;
}
std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

Manifest manifest(int64_t step, std::vector<ExpertEntry> experts, std::vector<FileEntry> ne) {
  Manifest m;
  m.step = step;
  m.tier = Tier::durable;
  m.layout = SourceLayout::Universal;
  m.tag = "t";
  m.shape.experts_per_layer = {2};
  m.policy = "sequential";
  m.k = 1;
  m.non_expert = std::move(ne);
  m.experts = std::move(experts);
  return m;
}
}  // namespace

TEST(PecStore, ObjectsRoundTripDeduplicateAndDetectDamage) {
  std::string d = fresh("objects");
  Store st(d, Tier::durable, StoreOpen::create);
  std::string text(100000, 'x');
  for (size_t i = 0; i < text.size(); i += 7) text[i] = static_cast<char>('a' + i % 26);
  FileEntry f = st.put_file("a/b.pt", bytes_of(text), 30000);
  EXPECT_EQ(f.chunks.size(), 4u);
  EXPECT_EQ(st.read_file(f), bytes_of(text));
  FileEntry again = st.put_file("c.pt", bytes_of(text), 30000);
  EXPECT_EQ(again.chunks[0].stored, 0u);  // already there
  std::string path = st.objects().path_of(f.chunks[1].object);
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(fs::file_size(path) - 5));
    io.put('\x7f');
  }
  EXPECT_THROW(st.read_file(f), ObjectError);
  fs::remove(path);
  EXPECT_THROW(st.read_file(f), ObjectError);
}

TEST(PecStore, ManifestChecksumAndCommit) {
  std::string d = fresh("manifest");
  Store st(d, Tier::durable, StoreOpen::create);
  EXPECT_TRUE(st.committed_steps().empty());
  st.commit(manifest(7, {}, {st.put_file("x", bytes_of("hello"), 1 << 20)}));
  ASSERT_EQ(st.committed_steps(), std::vector<int64_t>{7});
  EXPECT_EQ(st.load_manifest(7).non_expert[0].path, "x");
  std::string text;
  {
    std::ifstream in(st.manifest_path(7));
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto pos = text.find("\"x\"");
  ASSERT_NE(pos, std::string::npos);
  text[pos + 1] = 'y';
  std::ofstream(st.manifest_path(7)) << text;
  EXPECT_THROW(st.load_manifest(7), Error);
  EXPECT_THROW(Store(fresh("absent"), Tier::durable, StoreOpen::existing), Error);
}

TEST(PecStore, GarbageCollectionKeepsNewestCopiesOfTheKeptSteps) {
  std::string d = fresh("gc");
  Store st(d, Tier::durable, StoreOpen::create);
  auto expert = [&](int e, const std::string& v) { return ExpertEntry{0, e, {st.put_file("e" + std::to_string(e), bytes_of(v), 1 << 20)}}; };
  auto ne = [&](const std::string& v) { return st.put_file("ne", bytes_of(v), 1 << 20); };
  st.commit(manifest(1, {expert(0, "e0@1"), expert(1, "e1@1")}, {ne("ne@1")}));
  st.commit(manifest(2, {expert(0, "e0@2")}, {ne("ne@2")}));
  st.commit(manifest(3, {expert(0, "e0@3")}, {ne("ne@3")}));
  st.put_file("orphan", bytes_of("from a crashed save"), 1 << 20);
  GcStats gc = st.collect_garbage(1);
  // Step 3 needs e0@3 and e1@1: manifest 1 is pruned to expert 1, manifest 2 removed.
  EXPECT_EQ(st.committed_steps(), (std::vector<int64_t>{1, 3}));
  Manifest m1 = st.load_manifest(1);
  EXPECT_TRUE(m1.non_expert_pruned);
  ASSERT_EQ(m1.experts.size(), 1u);
  EXPECT_EQ(m1.experts[0].expert, 1);
  EXPECT_EQ(st.read_file(m1.experts[0].files[0]), bytes_of("e1@1"));
  EXPECT_EQ(st.objects().list().size(), 3u);  // ne@3, e0@3, e1@1
  EXPECT_EQ(gc.objects_removed, 5u);          // ne@1, e0@1, ne@2, e0@2, orphan
}

// zstd level 0 stores the bytes as they are ("UCPKOBJ0" header), read back and damage-checked alike.
TEST(PecStore, LevelZeroStoresUncompressed) {
  std::string d = fresh("raw");
  Store st(d, Tier::durable, StoreOpen::create, 0);
  std::string text(100000, 'x');
  FileEntry f = st.put_file("a.pt", bytes_of(text), 30000);
  std::string path = st.objects().path_of(f.chunks[0].object);
  EXPECT_EQ(fs::file_size(path), 32u + 30000u);  // highly compressible, yet stored whole
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "UCPKOBJ0");
  EXPECT_EQ(st.read_file(f), bytes_of(text));
  {
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(100);
    io.put('y');
  }
  EXPECT_THROW(st.read_file(f), ObjectError);
}

// An object file no committed manifest names (left by a save that died before its batched fsync,
// possibly torn) is rewritten, not reused; a trusted one is reused.
TEST(PecStore, UntrustedLeftoverObjectIsRewritten) {
  std::string d = fresh("untrusted");
  Store st(d, Tier::durable, StoreOpen::create);
  std::string text(5000, 'q');
  FileEntry f = st.put_file("a.pt", bytes_of(text), 1 << 20);
  std::string path = st.objects().path_of(f.chunks[0].object);
  { std::ofstream(path, std::ios::binary | std::ios::trunc) << "torn"; }
  Store again(d, Tier::durable, StoreOpen::existing);
  again.objects().trust({});
  FileEntry g = again.put_file("a.pt", bytes_of(text), 1 << 20);
  EXPECT_GT(g.chunks[0].stored, 0u);  // written again
  EXPECT_EQ(again.read_file(g), bytes_of(text));
  Store third(d, Tier::durable, StoreOpen::existing);
  third.objects().trust({g.chunks[0].object});
  EXPECT_EQ(third.put_file("a.pt", bytes_of(text), 1 << 20).chunks[0].stored, 0u);  // reused
}

}  // namespace store_test
