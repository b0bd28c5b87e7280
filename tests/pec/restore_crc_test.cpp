// Issue 32, cause 8: the restore writer keeps the CRC-32 a zip record had in the source. A byte
// flipped inside an expert fragment of an optimizer shard, its CRC left stale (damage ucp-union
// refuses), must not come back with a fresh CRC when every byte of the record comes from that one
// save; a record that mixes in fragments of an older save cannot keep the source's CRC and gets
// one recomputed from its bytes (zlib's crc32 is the independent truth here).
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "core/error.h"
#include "io/torch/verify.h"
#include "io/zip/zip_directory.h"
#include "pec/checkpoint.h"
#include "pec/record_crcs.h"
#include "pec/restore_writer.h"
#include "pec/store.h"
#include "support/files.h"

namespace restore_crc_test {

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
    std::optional<CutList> cut;
    FileEntry f = store.put_file(rel, read_non_expert(src, rel, cut).bytes(), uint64_t{1} << 20);
    f.cut = cut;
    non_expert.push_back(std::move(f));
  }
  for (const auto& [key, parts] : src.experts) {
    experts.push_back({key.first, key.second, {}});
    for (const auto& part : parts) {
      FileEntry f = store.put_file(part.path, read_expert_part(src, part).bytes(), uint64_t{1} << 20);
      if (!part.ranges.empty()) f.ranges = part.ranges;
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

namespace {
// The range CRC tables pec-save records (pec/record_crcs.h): the non-expert entries get `target`'s
// (the step saved), the expert entries `older`'s (the save their fragments are tagged with). Both
// computed without the record check, as a save that recorded whatever it read.
void record_tables(std::vector<FileEntry>& non_expert, std::vector<ExpertEntry>& experts, const SourceCheckpoint& target,
                   const SourceCheckpoint& older) {
  for (auto& f : non_expert)
    if (target.expert_ranges.count(f.path)) f.range_crcs = expert_range_crcs(target, f.path, false);
  for (auto& e : experts)
    for (auto& f : e.files) {
      if (!f.ranges) continue;
      std::map<std::tuple<std::string, uint64_t, uint64_t>, uint32_t> crc;
      for (const auto& r : expert_range_crcs(older, f.path, false)) crc[{r.record, r.offset, r.length}] = r.crc;
      std::vector<RangeCrc> own;
      for (const auto& r : *f.ranges) own.push_back({r.record, r.offset, r.length, crc.at({r.record, r.offset, r.length})});
      f.range_crcs = own;
    }
}
void record_tables(DamagedStep& d, const SourceCheckpoint& target, const SourceCheckpoint& older) {
  record_tables(d.non_expert, d.experts, target, older);
}

std::string restore_error(DamagedStep& d, int64_t expert_step) {
  try {
    restore(d.dir + "/out", d.store, d.non_expert, d.experts, expert_step);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// A record mixing saves whose older fragment is not what that save recorded: the fragments are tagged
// as saved at step 200, which recorded the undamaged fixture's CRCs; the stored fragment carries the
// flipped byte. Before: the record got the CRC of its bytes (laundered), now refused naming the step.
TEST(PecRestoreCrc, MixedRecordChecksAnOlderFragmentAgainstTheCrcItsSaveRecorded) {
  DamagedStep d("restore_crc_mixed_older");
  const SourceCheckpoint clean = open_checkpoint(kFixtureStep, {});
  record_tables(d, d.src, clean);
  const std::string what = restore_error(d, 200);
  EXPECT_NE(what.find(d.damage.first), std::string::npos) << what;
  EXPECT_NE(what.find("'" + d.damage.second + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("from step 200"), std::string::npos) << what;
}

// A record mixing saves whose bytes of the target step are damaged: the step-300 save recorded the
// CRCs of what it read (the flipped byte included); with its non-expert bytes they do not give the
// record CRC the source recorded. Before: laundered; now refused naming the step's bytes.
TEST(PecRestoreCrc, MixedRecordChecksTheTargetSaveAgainstTheSourceCrc) {
  DamagedStep d("restore_crc_mixed_target");
  record_tables(d, d.src, d.src);
  const std::string what = restore_error(d, 200);
  EXPECT_NE(what.find(d.damage.first), std::string::npos) << what;
  EXPECT_NE(what.find("'" + d.damage.second + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("saved at step 300"), std::string::npos) << what;
}

// The same with nothing damaged: every check passes and the mixed records get the CRC of their bytes.
TEST(PecRestoreCrc, MixedRecordOfUndamagedSavesIsRestored) {
  NoCrcPass no_crc_pass;
  const std::string dir = std::string(UCPKIT_BUILD_DIR) + "/pec-scratch/restore_crc_mixed_clean";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const SourceCheckpoint src = open_checkpoint(kFixtureStep, {});
  Store store(dir + "/store", Tier::durable, StoreOpen::create);
  std::vector<FileEntry> non_expert;
  std::vector<ExpertEntry> experts;
  put_step(src, store, non_expert, experts);
  record_tables(non_expert, experts, src, src);
  restore(dir + "/out", store, non_expert, experts, 200);
  for (const auto& [rel, ranges] : src.expert_ranges) {
    const std::string out = dir + "/out/" + rel;
    const std::string bytes = file_bytes(out);
    EXPECT_EQ(bytes, file_bytes(kFixtureStep + "/" + rel)) << rel;  // the same bytes: the fixture's CRCs hold
  }
}

// pec-save's record check: the damaged fixture copy's record is refused by name.
TEST(PecRestoreCrc, RangeCrcsRefuseADamagedRecord) {
  DamagedStep d("restore_crc_table_check");
  try {
    (void)expert_range_crcs(d.src, d.damage.first);
    FAIL() << "the damaged record was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(d.damage.first), std::string::npos) << what;
    EXPECT_NE(what.find("'" + d.damage.second + "'"), std::string::npos) << what;
  }
}

}  // namespace restore_crc_test
