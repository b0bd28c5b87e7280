// formats/deepspeed/file_names expected_files: the one list of the files a target layout writes,
// spelled out here name by name as DeepSpeed's save code names them (engine.py _get_ckpt_name,
// _get_zero_ckpt_name, _get_expert_ckpt_name, _get_optimizer_ckpt_name; PipelineModule.ckpt_layer_path).
// The end-to-end check (ucp-load writes exactly this list and reports its length) is
// tests/reshard/written_files_test.cpp.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/version_line.h"

namespace deepspeed_expected_files_test {

using namespace ucpkit::formats::deepspeed;

namespace {

// Native MoE, TP = PP = 1, DP 2, EP 2, two MoE layers of two experts.
TargetFiles native_moe_target() {
  TargetFiles t;
  t.dp = 2;
  t.ep = 2;
  t.native_moe = true;
  t.mp_ranks.resize(1);
  t.mp_ranks[0].experts = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  return t;
}

}  // namespace

TEST(ExpectedFiles, NativeMoeExpertOptimizerFilesAsEachLineWritesThem) {
  // Whether a line writes expp_rank_R_mp_rank_XX_optim_states.pt ({'optimizer': None}) under ZeRO-1/2:
  // every line up to v0.19.4 does (v0.19.3 engine.py:4933-4949: any expert checkpoint writer outside
  // ZeRO-3); v0.19.5 writes it only without ZeRO (engine.py:5066-5087, "do not emit an empty
  // per-expert optimizer payload").
  const std::map<std::string, bool> writes_expp = {
      {"0.14", true}, {"0.17.1", true}, {"0.19.2", true}, {"0.19.3", true}, {"0.19.5", false}};
  ASSERT_EQ(writes_expp.size(), moe_version_lines().size());
  const std::vector<std::string> experts = {
      "mp_rank_00_model_states.pt",
      "layer_0_expert_0_mp_rank_00_model_states.pt",
      "layer_0_expert_1_mp_rank_00_model_states.pt",
      "layer_1_expert_0_mp_rank_00_model_states.pt",
      "layer_1_expert_1_mp_rank_00_model_states.pt",
  };
  const std::vector<std::string> shards = {"zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                           "zero_pp_rank_1_mp_rank_00_optim_states.pt"};
  for (const auto& [name, expp] : writes_expp) {
    SCOPED_TRACE(name);
    std::vector<std::string> want = experts;
    if (expp) {
      want.push_back("expp_rank_0_mp_rank_00_optim_states.pt");
      want.push_back("expp_rank_1_mp_rank_00_optim_states.pt");
    }
    want.insert(want.end(), shards.begin(), shards.end());
    const VersionLine& line = moe_version_line(name);
    EXPECT_EQ(expected_files(native_moe_target(), &line), want);
    EXPECT_EQ(expected_expert_optim_files(2, 0, &line).size(), expp ? 2u : 0u);
  }
  // Without a line (not native MoE) no expert optimizer file.
  EXPECT_TRUE(expected_expert_optim_files(2, 0, nullptr).empty());
}

TEST(ExpectedFiles, PipelineZero3AndBf16Targets) {
  // TP 2, PP 2, DP 2: mp = pp_rank * tp + tp_rank; layer files carry the TP rank.
  TargetFiles t;
  t.tp = 2;
  t.pp = 2;
  t.dp = 2;
  t.bf16 = true;
  t.mp_ranks.resize(4);
  t.mp_ranks[0].layers = t.mp_ranks[1].layers = {1, 3};
  t.mp_ranks[2].layers = t.mp_ranks[3].layers = {4, 6};
  EXPECT_EQ(expected_model_files(t, 3, nullptr),
            (std::vector<std::string>{"mp_rank_03_model_states.pt", "layer_04-model_01-model_states.pt",
                                      "layer_06-model_01-model_states.pt"}));
  EXPECT_EQ(expected_rank_files(t, 1, 2), (std::vector<std::string>{"bf16_zero_pp_rank_1_mp_rank_02_optim_states.pt"}));
  EXPECT_EQ(expected_files(t, nullptr).size(), 4u * (1 + 2) + 4u * 2);
  // ZeRO-3: no mp_rank file; per DP rank a model-states file and the optimizer shard.
  TargetFiles z;
  z.dp = 2;
  z.zero3 = true;
  z.mp_ranks.resize(1);
  EXPECT_EQ(expected_files(z, nullptr),
            (std::vector<std::string>{"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                      "zero_pp_rank_1_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"}));
}

}  // namespace deepspeed_expected_files_test
