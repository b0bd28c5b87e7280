// Issue 32, the gap left by cause 8: a zip record of an optimizer shard that a partial restore fills
// from several saves (the target step's fragments and older steps' fragments of the experts it did
// not save) cannot keep the CRC-32 the source recorded. Before, such a record got a CRC recomputed
// from its bytes, so a byte damaged under a stale CRC in the target step's source came back with a
// valid CRC (laundered; 4 of 60 hand runs). Now pec-save records the CRC-32 of every expert range,
// checked against each record's own CRC (the damaged source is refused, naming the file and record),
// and the restore checks each piece against the CRC its own save recorded.
//
// Real tools on the pec `ds` fixture (native MoE, 2 MoE layers x 4 experts, EP 2, DP 4), run as a job
// script runs them: from the job's folder, with relative paths. UCPKIT_TEST_BIN runs them against other
// tools (those before this change fail MixedRecordDamageIsRefused: exit 0 and a laundered record).
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/zip/zip_directory.h"
#include "pec/checkpoint.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"
#include "job.h"

namespace mixed_save_crc_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::testing;

namespace {

std::map<std::string, ZipRecord> records_of(const std::string& bytes, const std::string& path) {
  return read_zip_directory({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, path);
}

// `pec-save` of checkpoint folder `ck` (relative to the job folder) as step `step`, K = 1 sequential.
std::string save(const std::string& ck, int64_t step) {
  const std::string s = std::to_string(step);
  return kBin + "/pec-save -q --checkpoint " + ck + " --store store --step " + s + " --policy sequential --k 1 --tokens " +
         kFx + "/tokens/step" + s + ".json";
}

std::string restore(const std::string& out, int64_t step) {
  return kBin + "/pec-restore -q --store store --output " + out + " --step " + std::to_string(step);
}


// Expert (layer 0, expert 1) is the one the sequential policy saves at step 300 after steps 100 (all
// experts, the first save) and 200: its fragment in DP rank 0's optimizer shard shares its records with
// experts saved at older steps. One byte of that fragment XORed, the record's CRC-32 left stale.
// Returns the shard (relative to the step folder) and the record.
std::pair<std::string, std::string> damage_saved_fragment(const std::string& step_folder) {
  const pec::SourceCheckpoint src = pec::open_checkpoint(step_folder, {});
  for (const auto& part : src.experts.at({0, 1})) {
    if (part.ranges.empty()) continue;
    const std::string path = step_folder + "/" + part.path;
    std::string bytes = file_bytes(path);
    const pec::ByteRange& r = part.ranges.front();
    const ZipRecord rec = records_of(bytes, path).at(r.record);
    // Another expert's range in the same record: the restore of step 300 mixes saves there.
    bool shared = false;
    for (const auto& other : src.expert_ranges.at(part.path))
      if (other.record == r.record && other.offset != r.offset) shared = true;
    EXPECT_TRUE(shared) << r.record << " holds no other expert's range";
    bytes[rec.data_offset + r.offset + r.length / 2] ^= 0x10;
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    return {part.path, r.record};
  }
  ADD_FAILURE() << "expert (0, 1) has no fragment in a shared file";
  return {};
}
}  // namespace

TEST(PecMixedSaveCrc, MixedRecordDamageIsRefused) {
  PecJob job("pec_mixed_crc_damage", {100, 200, 300});
  ASSERT_EQ(job.run(save("ck100", 100)).rc, 0);
  ASSERT_EQ(job.run(save("ck200", 200)).rc, 0);
  const auto [shard, record] = damage_saved_fragment(job.dir + "/ck300/global_step300");
  const SplitResult s = job.run(save("ck300", 300));
  if (s.rc == 0) {
    // Before: the save stored the damage; the restore must then refuse it, never give it a fresh CRC.
    const SplitResult r = job.run(restore("out", 300));
    if (r.rc == 0) {
      const std::string out = job.dir + "/out/global_step300/" + shard;
      const std::string bytes = file_bytes(out);
      const ZipRecord rec = records_of(bytes, out).at(record);
      const uint32_t truth = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + rec.data_offset), rec.size));
      ADD_FAILURE() << "save and restore exit 0 over a damaged record; its CRC-32 in the output is "
                    << (rec.crc32 == truth ? "recomputed over the damage (laundered)" : "stale");
    }
    return;
  }
  EXPECT_EQ(s.rc, 1) << s.err;
  EXPECT_EQ(std::count(s.err.begin(), s.err.end(), '\n'), 1) << s.err;
  EXPECT_NE(s.err.find(shard), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("'" + record + "'"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("CRC-32"), std::string::npos) << s.err;
  EXPECT_FALSE(fs::exists(job.dir + "/store/manifests/step-000000000300.json"));
  // The store is as it was: step 200 restores.
  EXPECT_EQ(job.run(restore("out200", 200)).rc, 0);
}

// The same chain undamaged: step 300 restores with records mixing three saves, each record's CRC-32
// that of its bytes, and every expert-free record as the source had it.
TEST(PecMixedSaveCrc, UndamagedChainRestoresWithTheCrcOfEachRecord) {
  PecJob job("pec_mixed_crc_clean", {100, 200, 300});
  for (int s : {100, 200, 300}) ASSERT_EQ(job.run(save("ck" + std::to_string(s), s)).rc, 0) << s;
  const SplitResult r = job.run(restore("out", 300));
  ASSERT_EQ(r.rc, 0) << r.err;
  const pec::SourceCheckpoint src = pec::open_checkpoint(job.dir + "/ck300/global_step300", {});
  size_t mixed = 0;
  for (const auto& [rel, ranges] : src.expert_ranges) {
    const std::string out = job.dir + "/out/global_step300/" + rel;
    const std::string bytes = file_bytes(out);
    const std::string in = file_bytes(job.dir + "/ck300/global_step300/" + rel);
    const auto in_records = records_of(in, rel);
    for (const auto& [name, rec] : records_of(bytes, out)) {
      const uint32_t truth = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bytes.data() + rec.data_offset), rec.size));
      EXPECT_EQ(rec.crc32, truth) << rel << " " << name;
      if (rec.crc32 != in_records.at(name).crc32) ++mixed;
    }
  }
  EXPECT_GT(mixed, 0u) << "no record mixed saves: the test would not reach the check";
}

}  // namespace mixed_save_crc_test
