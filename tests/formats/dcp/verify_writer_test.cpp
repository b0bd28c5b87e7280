// The writer's side of scripts/dcp_verify.sh (outside CI): with UCPKIT_DCP_VERIFY_OUT=<folder> set,
// writes our DCP output for every committed fixture with a truth (whole tensors; rows and columns for
// 2 ranks; rows and a 2x2 grid for 4 ranks) and the merged rank-local save, plus cases.tsv
// (folder, fixture, world size it was written for), for the real torch 2.6 dcp.load to check.
// Without the variable it only checks that the case list names existing fixtures.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "formats/dcp/dcp_data.h"
#include "formats/dcp/merge.h"
#include "formats/dcp/rewrite.h"

namespace fs = std::filesystem;
using namespace ucpkit::formats::dcp;

namespace {

const std::vector<std::string> kFixtures = {"fsdp_w2",  "twod_w4",        "fsdp_optim_w2", "fsdp_tp_optim_w4",
                                            "plain_w2", "single_item_w1", "torch113_w2"};

struct Case {
  std::string name;
  Target target;
  int64_t world;
};

const std::vector<Case> kTargets = {{"whole", Target::whole(), 1},
                                    {"rows2", Target::rows(2), 2},
                                    {"cols2", Target::columns(2), 2},
                                    {"rows4", Target::rows(4), 4},
                                    {"grid4", Target::grid(4, 2), 4}};

}  // namespace

TEST(DcpVerifyWriter, WritesOurOutputForRealTorch) {
  const std::string& data = ucpkit::testing::kDcpData;
  for (const auto& f : kFixtures) EXPECT_TRUE(fs::exists(data + "/" + f + "/.metadata")) << f;
  const char* env = std::getenv("UCPKIT_DCP_VERIFY_OUT");
  if (!env || !*env) GTEST_SKIP() << "UCPKIT_DCP_VERIFY_OUT not set (scripts/dcp_verify.sh sets it)";
  const std::string out = env;
  fs::create_directories(out);
  std::ofstream cases(out + "/cases.tsv");
  for (const auto& f : kFixtures)
    for (const auto& c : kTargets) {
      const std::string name = f + "__" + c.name;
      fs::remove_all(out + "/" + name);
      rewrite_dcp(data + "/" + f, out + "/" + name, c.target);
      cases << name << "\t" << f << "\t" << c.world << "\n";
    }
  const std::string merged = "ranklocal_w2__merged";
  fs::remove_all(out + "/" + merged);
  merge_rank_local(rank_local_parts(data + "/ranklocal_w2"), out + "/" + merged);
  cases << merged << "\tranklocal_w2\t2\n";
}
