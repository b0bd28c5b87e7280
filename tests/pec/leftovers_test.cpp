// Issue 32 (WEAK, durability and leftovers), through real pec-save / pec-restore runs on the pec `ds`
// fixture, run as a job script runs them (from the job's folder, relative paths):
//  * a failed restore left the --output folder it had created (empty);
//  * a fast tier that cannot be used failed the durable save too, and left the durable store folder
//    without a manifest;
//  * a save refused after it had created its store folder left that folder behind.
// UCPKIT_TEST_BIN runs them against other tools (the 05:58 snapshot fails all three).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/zip/zip_directory.h"
#include "pec/checkpoint.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"
#include "job.h"

namespace leftovers_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::testing;

namespace {

std::string save(const std::string& ck, int64_t step, const std::string& extra = "") {
  return kBin + "/pec-save -q --checkpoint " + ck + " --store store --step " + std::to_string(step) +
         " --policy sequential --k 1 " + extra;
}

}  // namespace

TEST(PecLeftovers, FailedRestoreLeavesNoOutputFolder) {
  PecJob job("pec_leftover_restore", {100});
  ASSERT_EQ(job.run(save("ck100", 100)).rc, 0);
  // Every object of the step's non-expert state emptied: no intact copy, the restore fails after it
  // has created its output folder.
  const auto m = nlohmann::json::parse(file_bytes(job.dir + "/store/manifests/step-000000000100.json"));
  for (const auto& f : m.at("manifest").at("non_expert"))
    for (const auto& c : f.at("chunks")) {
      const std::string id = c.at("object").get<std::string>();
      fs::resize_file(job.dir + "/store/objects/" + id.substr(0, 2) + "/" + id, 0);
    }
  const SplitResult r = job.run(kBin + "/pec-restore -q --store store --output new/out --step 100");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_FALSE(fs::exists(job.dir + "/new/out")) << r.err;
  EXPECT_FALSE(fs::exists(job.dir + "/new")) << r.err;
}

TEST(PecLeftovers, UnusableFastTierDoesNotFailTheDurableSave) {
  PecJob job("pec_leftover_fast", {100});
  std::ofstream(job.dir + "/blocker") << "a file where the fast tier's parent folder should be\n";
  const SplitResult s = job.run(save("ck100", 100, "--fast-store blocker/fast --k-snapshot 1"));
  EXPECT_EQ(s.rc, 0) << s.err;
  EXPECT_NE(s.err.find("fast tier"), std::string::npos) << s.err;
  EXPECT_NE(s.err.find("blocker/fast"), std::string::npos) << s.err;
  EXPECT_TRUE(fs::exists(job.dir + "/store/manifests/step-000000000100.json")) << s.err;
  const SplitResult r = job.run(kBin + "/pec-restore -q --store store --output out --step 100");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(tree_bytes(job.dir + "/out/global_step100"), tree_bytes(job.dir + "/ck100/global_step100"));
}

TEST(PecLeftovers, RefusedSaveLeavesNoStoreFolder) {
  PecJob job("pec_leftover_store", {100});
  // A byte of an expert fragment flipped under its stale CRC: refused once the store folder exists.
  const std::string step = job.dir + "/ck100/global_step100";
  const pec::SourceCheckpoint src = pec::open_checkpoint(step, {});
  const auto& [rel, ranges] = *src.expert_ranges.begin();
  std::string bytes = file_bytes(step + "/" + rel);
  const auto records = read_zip_directory({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, rel);
  bytes[records.at(ranges.front().record).data_offset + ranges.front().offset] ^= 0x01;
  std::ofstream(step + "/" + rel, std::ios::binary | std::ios::trunc) << bytes;
  const SplitResult s = job.run(save("ck100", 100));
  EXPECT_EQ(s.rc, 1) << s.err;
  EXPECT_FALSE(fs::exists(job.dir + "/store")) << s.err;
}

}  // namespace leftovers_test
