// formats/deepspeed/autoep_slices, worked by hand: AutoEP fuses a layer's local experts into
// <prefix>.w1/w2/w3 [E_local, ...] (moe/ep_experts.py:212-214), so a flat run of such a weight spans
// experts; global expert = ep_rank * E_local + local (autoep_universal.py:333-338). ZeRO-3 splits the
// fused weight on its own into ceil(n / count) slices (stage3.py:833-880), part = ep_rank * count +
// partition_rank. The ZeRO-1/2 slicing is read from the AutoEP fixture's model file.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/deepspeed/autoep_slices.h"
#include "formats/deepspeed/fixture_files.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"

namespace deepspeed_autoep_slices_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
namespace fx = ucpkit::testing::fixtures;
using ucpkit::testing::error_of;

namespace {

struct ExpertRun {
  int expert;
  int64_t offset, numel;
  bool operator==(const ExpertRun&) const = default;
};

std::vector<ExpertRun> runs(const std::vector<ds::AutoEpExpertRun>& in) {
  std::vector<ExpertRun> out;
  for (const auto& r : in) out.push_back({r.global_expert, r.offset, r.numel});
  return out;
}

}  // namespace

// [E_local = 2, 3, 4] on EP rank 1: 12 elements per expert, local 0 and 1 are global 2 and 3.
TEST(AutoEpSlices, FusedRunSplitPerExpert) {
  EXPECT_EQ(runs(ds::split_fused_expert_run(10, 6, 12, 2, 1, "f", "w1")), (std::vector<ExpertRun>{{2, 0, 2}, {3, 2, 4}}));
  EXPECT_EQ(runs(ds::split_fused_expert_run(0, 24, 12, 2, 0, "f", "w1")), (std::vector<ExpertRun>{{0, 0, 12}, {1, 12, 12}}));
  EXPECT_EQ(runs(ds::split_fused_expert_run(12, 0, 12, 2, 0, "f", "w1")), std::vector<ExpertRun>{});
  EXPECT_EQ(error_of([] { ds::split_fused_expert_run(20, 6, 12, 2, 0, "shard.pt", "w1"); }),
            "shard.pt: fragment of AutoEP expert weight w1 lies outside it");
}

// ZeRO-3: 24 elements over 2 partitions (12 each) or 3 (8 each).
TEST(AutoEpSlices, Zero3PartitionRuns) {
  // count 2, EP rank 1, partition 1: elements [12, 24) = local expert 1 = global 3.
  EXPECT_EQ(runs(ds::autoep_zero3_fragment_runs({2, 3, 4}, 2, 1 * 2 + 1, 12, "f", "w")), (std::vector<ExpertRun>{{3, 0, 12}}));
  // count 3, EP rank 0, partition 1: elements [8, 16) = 4 of local 0, 4 of local 1.
  EXPECT_EQ(runs(ds::autoep_zero3_fragment_runs({2, 3, 4}, 3, 1, 8, "f", "w")), (std::vector<ExpertRun>{{0, 0, 4}, {1, 4, 4}}));
  // count 5: ceil(24 / 5) = 5 per partition; the last (partition 4) holds 4 elements and the padding.
  EXPECT_EQ(runs(ds::autoep_zero3_fragment_runs({2, 3, 4}, 5, 4, 4, "f", "w")), (std::vector<ExpertRun>{{1, 0, 4}}));
}

// The ZeRO-1 fixture's mp_rank file: every fused weight of ds_autoep_layers found in param_shapes as
// [2, ...] (4 experts over EP 2), back to back in its group's flat buffer.
TEST(AutoEpSlices, Zero12SlicingFromTheModelFile) {
  const std::string path = (fx::step_dir("autoep_dp4_ep2_zero1_bf16") / "mp_rank_00_model_states.pt").string();
  const TorchFile f = load_torch_file(path);
  const ds::AutoEpZero12Slicing s = ds::autoep_zero12_slicing(f.root, path);
  ASSERT_EQ(s.weights.size(), 6u);  // 2 layers x w1, w2, w3
  EXPECT_FALSE(s.data_before_expert);
  for (const auto& [name, w] : s.weights) {
    EXPECT_EQ(w.local_experts, 2) << name;
    EXPECT_GT(w.per_expert, 0) << name;
    EXPECT_EQ(name.rfind("model.layers." + std::to_string(w.moe_layer) + ".mlp.experts.w", 0), 0u) << name;
  }
  // A dense model file has no slicing.
  const std::string dense = (fx::step_dir("gpt_tp2dp2_z2_fp16") / "mp_rank_00_model_states.pt").string();
  EXPECT_TRUE(ds::autoep_zero12_slicing(load_torch_file(dense).root, dense).empty());
}

}  // namespace deepspeed_autoep_slices_test
