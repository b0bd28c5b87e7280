// pec::autoep_zero3_experts reads AutoEP ZeRO-3 folders through formats/deepspeed (no extract plan) and
// refuses what ucp-union's plan refuses: files of another save mixed in, a rank whose recorded place
// contradicts its shard's partition groups.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "pec/autoep_zero3.h"
#include "support/errors.h"
#include "support/paths.h"
#include "support/process.h"

namespace autoep_zero3_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

// autoep_z3 step 100 (tests/pec/fixtures.py: dp4, ep2, E=4 per layer) with `file` taken from step 200.
std::string mixed(const std::string& name, const std::string& file) {
  const std::string dir = ucpkit::testing::scratch_dir("autoep_zero3_" + name);
  fs::remove_all(dir);
  fs::copy(kFx + "/autoep_z3/step100", dir, fs::copy_options::recursive);
  fs::copy_file(kFx + "/autoep_z3/step200/global_step200/" + file, dir + "/global_step100/" + file,
                fs::copy_options::overwrite_existing);
  return dir + "/global_step100";
}

}  // namespace

TEST(PecAutoEpZero3Experts, EveryExpertOfEveryLayerHasRanges) {
  if (!fs::exists(kFx + "/autoep_z3")) GTEST_SKIP() << "fixtures not built (ctest -R '^fixtures_pec$')";
  const auto e = pec::autoep_zero3_experts(kFx + "/autoep_z3/step100/global_step100");
  EXPECT_EQ(e.ep_size, 2);
  ASSERT_FALSE(e.experts_per_layer.empty());
  // Every (layer, expert) is found in some shard: E experts per layer, each with byte ranges.
  for (size_t l = 0; l < e.experts_per_layer.size(); ++l)
    for (int x = 0; x < e.experts_per_layer[l]; ++x) {
      size_t ranges = 0;
      for (const auto& [file, by_expert] : e.ranges)
        if (auto it = by_expert.find({static_cast<int>(l), x}); it != by_expert.end()) ranges += it->second.size();
      EXPECT_GT(ranges, 0u) << "layer " << l << " expert " << x;
    }
}

TEST(PecAutoEpZero3Experts, FilesOfAnotherSaveAreRefusedNamingTheFile) {
  if (!fs::exists(kFx + "/autoep_z3")) GTEST_SKIP() << "fixtures not built (ctest -R '^fixtures_pec$')";
  for (const char* file : {"bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_pp_rank_3_mp_rank_00_model_states.pt"}) {
    const std::string dir = mixed(std::string(file).substr(0, 20), file);
    const std::string e = ucpkit::testing::error_of([&] { pec::autoep_zero3_experts(dir); });
    EXPECT_NE(e.find(dir + "/" + file), std::string::npos) << e;
    EXPECT_NE(e.find("files of different saves"), std::string::npos) << e;
  }
}

}  // namespace autoep_zero3_test
