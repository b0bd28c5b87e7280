// Issue 32 (WEAK, cross-checks), through real pec-save runs on the pec `ds` fixture, run as a job script
// runs them (from the job's folder, relative paths): a store inside the checkpoint folder saved its own
// files as part of the checkpoint; it is a usage error naming the option. UCPKIT_TEST_BIN runs the
// test against other tools (the 05:58 snapshot fails it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"
#include "job.h"

namespace cross_checks_test {

namespace fs = std::filesystem;
using namespace ucpkit::testing;

TEST(PecCrossChecks, StoreInsideTheCheckpointIsRefused) {
  const PecJob job("pec_store_inside", {100});
  const std::string& dir = job.dir;
  for (const auto& [store, option] : {std::pair{"ck100/global_step100/pec", "--store"}, std::pair{"ck100/global_step100/fast", "--fast-store"}}) {
    const std::string tiers = option == std::string("--store") ? std::string("--store ") + store
                                                                : std::string("--store outside --fast-store ") + store + " --k-snapshot 1";
    const SplitResult r = job.run(kBin + "/pec-save -q --checkpoint ck100/global_step100 --step 100 --policy sequential --k 1 " + tiers);
    EXPECT_EQ(r.rc, 2) << option << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(option) + " " + store), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir + "/" + store)) << option;
    EXPECT_FALSE(fs::exists(dir + "/outside")) << option;
  }
}

}  // namespace cross_checks_test
