// formats/deepspeed/autoep_zero3_ranks: the four DP ranks' model files of the AutoEP ZeRO-3 fixture
// (dsgen/autoep.py; engine.py:5090, every rank writes its own) agree; a rank whose layers describe
// another model, or too few ranks for the EP size, is refused naming that rank's file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/deepspeed/autoep_zero3_ranks.h"
#include "formats/deepspeed/fixture_files.h"
#include "formats/deepspeed/model_states.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"

namespace deepspeed_autoep_zero3_ranks_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
using ucpkit::testing::error_of;

namespace {

struct Ranks {
  std::vector<std::vector<ds::AutoEpLayer>> layers;
  std::vector<std::string> files;
};

Ranks fixture_ranks() {
  Ranks r;
  r.files = fx::files_with("autoep_dp4_ep2_zero3_bf16", "model_states.pt");
  for (const auto& path : r.files) r.layers.push_back(ds::autoep_layers(ds::read_model_states(load_torch_file(path), path), path));
  return r;
}

}  // namespace

TEST(AutoEpZero3Ranks, FixtureRanksAgree) {
  const Ranks r = fixture_ranks();
  ASSERT_EQ(r.files.size(), 4u);
  EXPECT_EQ(error_of([&] { ds::check_autoep_ranks_agree(r.layers, r.files, 4); }), "");
}

TEST(AutoEpZero3Ranks, DisagreeingRankRefusedNamingItsFile) {
  Ranks r = fixture_ranks();
  r.layers[2][1].num_experts = 8;
  r.layers[2][1].num_local_experts = 4;
  const std::string e = error_of([&] { ds::check_autoep_ranks_agree(r.layers, r.files, 4); });
  EXPECT_EQ(e.rfind(r.files[2] + ": ", 0), 0u) << e;

  Ranks prefix = fixture_ranks();
  prefix.layers[3][0].expert_key_prefix = "model.layers.0.mlp.other";
  EXPECT_EQ(error_of([&] { ds::check_autoep_ranks_agree(prefix.layers, prefix.files, 4); }).rfind(prefix.files[3] + ": ", 0), 0u);

  // ep_size 2 with an expert-DP world of 2 needs 4 ranks, not 2.
  Ranks two = fixture_ranks();
  two.layers.resize(2);
  two.files.resize(2);
  EXPECT_NE(error_of([&] { ds::check_autoep_ranks_agree(two.layers, two.files, 2); }), "");
}

}  // namespace deepspeed_autoep_zero3_ranks_test
