// The streaming restore writer without the CLI (the streaming digests: checksum_test.cpp): a
// native checkpoint stored in tiny chunks (so chunk boundaries fall inside cut maps, expert ranges and
// zip records) is rebuilt byte for byte from the generator's files, with any memory budget.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "pec/checkpoint.h"
#include "pec/restore_writer.h"
#include "pec/store.h"
#include "support/files.h"

namespace restore_writer_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::pec;
using ucpkit::testing::file_bytes;

namespace {
const std::string kStep = std::string(UCPKIT_FIXTURES_DIR) + "/ds/step300/global_step300";

// Stores every file of `src` (non-expert files with their expert ranges cut out, expert parts
// separately) in chunks of a few KiB; returns the entries.
void store_all(const SourceCheckpoint& src, Store& store, std::vector<FileEntry>& non_expert, std::vector<ExpertEntry>& experts) {
  for (const auto& rel : src.non_expert_files) {
    std::optional<CutList> cut;
    Blob b = read_non_expert(src, rel, cut);
    FileEntry f = store.put_file(rel, b.bytes(), 4093);
    f.cut = cut;
    non_expert.push_back(f);
  }
  for (const auto& [key, parts] : src.experts) {
    ExpertEntry x{key.first, key.second, {}};
    for (const auto& p : parts) {
      Blob b = read_expert_part(src, p);
      FileEntry f = store.put_file(p.path, b.bytes(), 3001);
      if (!p.ranges.empty()) f.ranges = p.ranges;
      x.files.push_back(f);
    }
    experts.push_back(x);
  }
}

// The fixture's step 300 stored in a fresh store under build/pec-scratch/<name>.
struct Stored {
  explicit Stored(const std::string& name)
      : src(open_checkpoint(kStep, {})), dir(std::string(UCPKIT_BUILD_DIR) + "/pec-scratch/" + name), store(fresh(dir) + "/store", Tier::durable, StoreOpen::create) {
    store_all(src, store, non_expert, experts);
  }
  static std::string fresh(const std::string& d) {
    fs::remove_all(d);
    return d;
  }
  SourceCheckpoint src;
  std::string dir;
  Store store;
  std::vector<FileEntry> non_expert;
  std::vector<ExpertEntry> experts;
};
}  // namespace

TEST(PecRestoreWriter, TinyChunksRebuildEveryFileExactly) {
  Stored st("writer");
  const std::string step = kStep, d = st.dir;
  const SourceCheckpoint& src = st.src;
  Store& store = st.store;
  const auto& non_expert = st.non_expert;
  const auto& experts = st.experts;
  ASSERT_FALSE(src.expert_ranges.empty());  // optimizer shards with expert fragments cut out
  for (uint64_t mib : {64u, 256u}) {
    const std::string out = d + "/out" + std::to_string(mib);
    RestoreWriter w(out, mib << 20);
    w.write_non_expert(store, non_expert);
    std::vector<RestoreWriter::ExpertCopy> copies;
    for (const auto& x : experts) copies.push_back({&store, &x});
    auto outcomes = w.write_experts(copies);
    for (auto& o : outcomes) {
      EXPECT_TRUE(o.error.empty()) << o.error;
      w.accept(std::move(o));
    }
    w.finish();
    size_t files = 0;
    for (const auto& e : fs::recursive_directory_iterator(step))
      if (e.is_regular_file()) {
        ++files;
        const std::string rel = fs::relative(e.path(), step).string();
        EXPECT_EQ(file_bytes(out + "/" + rel), file_bytes(e.path().string())) << rel << " budget " << mib;
      }
    EXPECT_GT(files, 4u);
    EXPECT_EQ(w.bytes_written(), src.total_bytes() - src.expert_bytes_total + [&] {
      uint64_t n = 0;  // expert bytes outside the shards are whole files
      for (const auto& x : experts)
        for (const auto& f : x.files) n += f.ranges ? 0 : f.size;
      return n;
    }() + [&] {
      uint64_t n = 0;  // cut ranges are part of the shards' sizes
      for (const auto& [rel, rs] : src.expert_ranges)
        for (const auto& r : rs) n += r.length;
      return n;
    }());
  }
}

TEST(PecRestoreWriter, DamagedFragmentIsReportedAndDiscarded) {
  Stored st("writer_damaged");
  const std::string d = st.dir;
  Store& store = st.store;
  const auto& non_expert = st.non_expert;
  const auto& experts = st.experts;
  // Damage the last chunk of the first expert's optimizer fragments.
  const FileEntry* frag = nullptr;
  for (const auto& f : experts[0].files)
    if (f.ranges) frag = &f;
  ASSERT_NE(frag, nullptr);
  {
    std::fstream f(store.objects().path_of(frag->chunks.back().object), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put(0x5a);
  }
  RestoreWriter w(d + "/out", 64 << 20);
  w.write_non_expert(store, non_expert);
  auto outcomes = w.write_experts({{&store, &experts[0]}});
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_NE(outcomes[0].error.find("corrupt object"), std::string::npos) << outcomes[0].error;
  EXPECT_TRUE(outcomes[0].pieces.empty());
  w.discard(outcomes[0]);
  // Its ranges read as zeros again.
  std::string shard = file_bytes(d + "/out/" + frag->path);
  for (const auto& [path, range] : outcomes[0].fragments)
    EXPECT_EQ(shard.substr(range.first, range.second), std::string(range.second, '\0'));
}

TEST(PecRestoreWriter, BudgetTooSmallIsAUsageError) {
  EXPECT_THROW(RestoreWriter("/nonexistent", 16 << 20), UsageError);
}

}  // namespace restore_writer_test
