// Issue 32, cause 8: the restore writer keeps the CRC-32 a zip record had in the source. A byte
// flipped inside an expert fragment of an optimizer shard, its CRC left stale (damage ucp-union
// refuses), must not come back with a fresh CRC when every byte of the record comes from that one
// save; a record that mixes in fragments of an older save cannot keep the source's CRC and gets
// one recomputed from its bytes (zlib's crc32 is the independent truth here).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/torch/verify.h"
#include "io/zip/zip_directory.h"
#include "pec/checkpoint.h"
#include "pec/restore_writer.h"
#include "pec/store.h"
#include "support/files.h"

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::pec;
using ucpkit::testing::file_bytes;

namespace {
const std::string kFixtureStep = std::string(UCPKIT_FIXTURES_DIR) + "/ds/step300/global_step300";

std::map<std::string, ZipRecord> records_of(const std::string& bytes, const std::string& path) {
  return read_zip_directory({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, path);
}

// The fixture's step copied to `dir`/global_step300 with one byte XORed in the middle of the first
// expert range of the first shard that has one (CRC stale). Returns the shard and its record.
std::pair<std::string, std::string> damaged_copy(const std::string& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(kFixtureStep, dir + "/global_step300");
  const SourceCheckpoint clean = open_checkpoint(dir + "/global_step300", {});
  const auto& [rel, ranges] = *clean.expert_ranges.begin();
  const std::string path = dir + "/global_step300/" + rel;
  std::string bytes = file_bytes(path);
  const ZipRecord rec = records_of(bytes, path).at(ranges.front().record);
  bytes[rec.data_offset + ranges.front().offset + ranges.front().length / 2] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return {rel, ranges.front().record};
}

// Every file of `src` in `store`: non-expert files with the expert ranges cut out, expert parts apart.
void put_step(const SourceCheckpoint& src, Store& store, std::vector<FileEntry>& non_expert,
              std::vector<ExpertEntry>& experts) {
  for (const auto& rel : src.non_expert_files) {
    nlohmann::json cut;
    FileEntry f = store.put_file(rel, read_non_expert(src, rel, cut).bytes(), uint64_t{1} << 20);
    f.cut = cut;
    non_expert.push_back(std::move(f));
  }
  for (const auto& [key, parts] : src.experts) {
    experts.push_back({key.first, key.second, {}});
    for (const auto& part : parts) {
      FileEntry f = store.put_file(part.path, read_expert_part(src, part).bytes(), uint64_t{1} << 20);
      if (!part.ranges.empty()) f.ranges = ranges_to_json(part.ranges);
      experts.back().files.push_back(std::move(f));
    }
  }
}

// Restores the stored step into `out`, the experts tagged as saved at `expert_step` (300: the same
// save as the non-expert state).
void restore(const std::string& out, Store& store, const std::vector<FileEntry>& non_expert,
             const std::vector<ExpertEntry>& experts, int64_t expert_step) {
  RestoreWriter w(out, 64 << 20);
  w.write_non_expert(store, non_expert, 300);
  std::vector<RestoreWriter::ExpertCopy> copies;
  for (const auto& x : experts) copies.push_back({&store, &x, expert_step});
  for (auto& o : w.write_experts(copies)) {
    ASSERT_TRUE(o.error.empty()) << o.error;
    w.accept(std::move(o));
  }
  w.finish();
}


// pec-save's default: the files it parses are read without the CRC pass (only --verify asks for it).
struct NoCrcPass {
  NoCrcPass() : was(verify_files_crc()) { set_verify_files_crc(false); }
  ~NoCrcPass() { set_verify_files_crc(was); }
  bool was;
};

// A damaged copy of the fixture's step under build/pec-scratch/<name>, stored whole.
struct DamagedStep {
  explicit DamagedStep(const std::string& name)
      : no_crc_pass(), dir(std::string(UCPKIT_BUILD_DIR) + "/pec-scratch/" + name), damage(damaged_copy(dir)),
        src(open_checkpoint(dir + "/global_step300", {})), store(dir + "/store", Tier::durable, StoreOpen::create) {
    put_step(src, store, non_expert, experts);
  }
  NoCrcPass no_crc_pass;
  std::string dir;
  std::pair<std::string, std::string> damage;  // shard, record
  SourceCheckpoint src;
  Store store;
  std::vector<FileEntry> non_expert;
  std::vector<ExpertEntry> experts;
};
}  // namespace

TEST(PecRestoreCrc, DamageUnderAStaleCrcIsRefusedNotGivenAFreshCrc) {
  DamagedStep d("restore_crc_one_save");
  try {
    restore(d.dir + "/out", d.store, d.non_expert, d.experts, 300);
    FAIL() << "the damaged record was restored";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(d.damage.first), std::string::npos) << what;
    EXPECT_NE(what.find("'" + d.damage.second + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("CRC-32"), std::string::npos) << what;
  }
}

TEST(PecRestoreCrc, RecordMixingAnOlderSaveGetsTheCrcOfItsBytes) {
  DamagedStep d("restore_crc_mixed");
  restore(d.dir + "/out", d.store, d.non_expert, d.experts, 200);  // as if the experts came from step 200
  const std::string out = d.dir + "/out/" + d.damage.first;
  const std::string bytes = file_bytes(out);
  EXPECT_EQ(bytes.size(), file_bytes(d.dir + "/global_step300/" + d.damage.first).size());
  for (const auto& [name, r] : records_of(bytes, out)) {
    const uint32_t truth =
        static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + r.data_offset), r.size));
    EXPECT_EQ(r.crc32, truth) << name;  // the touched records recomputed, the others as saved (clean)
  }
}
