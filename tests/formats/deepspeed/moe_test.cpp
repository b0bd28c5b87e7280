// formats/deepspeed/moe, worked by hand from DeepSpeed's group construction (utils/groups.py
// _create_expert_and_data_parallel: expert-parallel groups of consecutive ranks, expert-data-parallel
// groups strided by EP; with use_data_before_expert_parallel_ the other way round) and the expert
// parameter names (moe/experts.py: ...deepspeed_moe.experts.deepspeed_experts.<j>...).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "formats/deepspeed/moe.h"
#include "support/errors.h"

namespace deepspeed_moe_test {

using namespace ucpkit;
namespace ds = ucpkit::formats::deepspeed;
using ucpkit::testing::error_of;

// DP 4, EP 2: expert-major EP groups {0,1}, {2,3} (ep_rank = d % 2), expert-DP groups {0,2}, {1,3};
// data-before-expert: EP groups {0,2}, {1,3} (ep_rank = d / 2), expert-DP groups {0,1}, {2,3}.
TEST(Moe, EpCoordinates) {
  const int ep_rank[4] = {0, 1, 0, 1}, edp[4] = {0, 0, 1, 1};
  for (int d = 0; d < 4; ++d) {
    const auto c = ds::ep_coords(d, 4, 2, false);
    EXPECT_EQ(c.ep_rank, ep_rank[d]) << d;
    EXPECT_EQ(c.edp_rank, edp[d]) << d;
    const auto t = ds::ep_coords(d, 4, 2, true);
    EXPECT_EQ(t.ep_rank, d / 2) << d;
    EXPECT_EQ(t.edp_rank, d % 2) << d;
  }
  EXPECT_NE(error_of([] { ds::ep_coords(0, 6, 4, false); }), "");  // EP must divide DP
}

TEST(Moe, ExpertNames) {
  const std::string n = "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.1.dense_h_to_4h.weight";
  EXPECT_EQ(ds::local_expert_index(n), 1);
  EXPECT_EQ(ds::with_expert_index(n, 5),
            "language_model.encoder.layers.3.mlp.deepspeed_moe.experts.deepspeed_experts.5.dense_h_to_4h.weight");
  EXPECT_EQ(ds::transformer_layer_index(n), 3);
  EXPECT_EQ(ds::local_expert_index("language_model.encoder.layers.3.mlp.dense_h_to_4h.weight"), std::nullopt);
  EXPECT_EQ(ds::transformer_layer_index("blocks.2.mlp.deepspeed_moe.experts.deepspeed_experts.0.w"), std::nullopt);
  EXPECT_EQ(ds::ep_size_from_group_name("ep_size_4"), 4);
  EXPECT_EQ(ds::ep_size_from_group_name("dense-params"), std::nullopt);
}

// Megatron's names give the layer number; names without layers.N give the moe_layer_id itself; two
// layers.N for one MoE layer are refused naming its file.
TEST(Moe, ExpertLayerNumbers) {
  std::map<int, ds::ExpertFileLayer> named{{0, {"a.pt", {1}, false}}, {1, {"b.pt", {3}, false}}};
  EXPECT_EQ(ds::expert_layer_numbers(named), (std::map<int, int>{{0, 1}, {1, 3}}));
  std::map<int, ds::ExpertFileLayer> unnamed{{0, {"a.pt", {}, true}}, {1, {"b.pt", {}, true}}};
  EXPECT_EQ(ds::expert_layer_numbers(unnamed), (std::map<int, int>{{0, 0}, {1, 1}}));
  std::map<int, ds::ExpertFileLayer> two{{0, {"a.pt", {1, 2}, false}}};
  EXPECT_NE(error_of([&] { ds::expert_layer_numbers(two); }).find("a.pt"), std::string::npos);
}

}  // namespace deepspeed_moe_test
