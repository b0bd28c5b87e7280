// Unit tests of lib/to_universal/fragment_map (the extract plan's I/O-free steps): shard groups and ZeRO-3
// sub-groups given as in-memory param_slice_mappings / param_shapes, fragments checked against values
// worked out by hand from the DeepSpeed layouts (docs/formats.md; ZeRO-3: ceil(numel/dp) slices,
// padding at the end, stage3.py; EP topology: ep_rank = d % EP, edp = d / EP by default, groups.py).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/deepspeed/moe.h"
#include "patterns/pattern_set.h"
#include "to_universal/fragment_map.h"
#include "support/errors.h"

namespace ucpkit::to_universal {
namespace fragment_map_test {
namespace {

using Frag = std::vector<int64_t>;  // file, group, offset, numel, part

std::vector<Frag> frags(const std::vector<SourceFragment>& fr) {
  std::vector<Frag> out;
  for (const auto& f : fr) out.push_back({f.file, f.group, f.offset, f.numel, f.part});
  return out;
}

using ucpkit::testing::error_of;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

patterns::PatternSet no_patterns() { return patterns::PatternSet::from_json(nlohmann::json::object(), "none"); }

ShardGroup dense_group(int file, int dp_rank, int dp, SliceMappings fragments) {
  ShardGroup g;
  g.file = file;
  g.group = 0;
  g.partition = group_partition(g.info, 0, dp_rank, dp, false, "shard.pt");
  g.fragments = std::move(fragments);
  g.states = {"fp32", "exp_avg", "exp_avg_sq"};
  g.has_step = true;
  return g;
}

TEST(UcpFragmentMap, DenseGroupIsPartitionedOverAllDpRanks) {
  const GroupPartition p = group_partition(GroupInfo{}, 0, 3, 4, false, "r3.pt");
  EXPECT_EQ(p.part, 3);
  EXPECT_EQ(p.count, 4);
  EXPECT_EQ(p.ep_rank, -1);
}

TEST(UcpFragmentMap, ExpertGroupFollowsTheEpTopology) {
  GroupInfo moe;
  moe.moe = true;
  moe.ep_size = 2;
  // DP 4, EP 2, default order: rank 3 is EP rank 1, expert-DP rank 1 of 2.
  GroupPartition p = group_partition(moe, 1, 3, 4, false, "r3.pt");
  EXPECT_EQ(p.ep_rank, 1);
  EXPECT_EQ(p.part, 1);
  EXPECT_EQ(p.count, 2);
  // Rank 1: EP rank 1, expert-DP rank 0; with data before expert: EP rank 0, expert-DP rank 1.
  p = group_partition(moe, 1, 1, 4, false, "r1.pt");
  EXPECT_EQ(p.ep_rank, 1);
  EXPECT_EQ(p.part, 0);
  p = group_partition(moe, 1, 1, 4, true, "r1.pt");
  EXPECT_EQ(p.ep_rank, 0);
  EXPECT_EQ(p.part, 1);
}

TEST(UcpFragmentMap, GroupPartitionRefusesAWrongPartitionCountOrNoEpSize) {
  GroupInfo info;
  info.partition_count = 3;
  const std::string m = error_of([&] { group_partition(info, 2, 0, 4, false, "r0.pt"); });
  EXPECT_TRUE(has(m, "r0.pt") && has(m, "param group 2 has partition_count 3, expected 4")) << m;
  GroupInfo moe;
  moe.moe = true;
  EXPECT_TRUE(has(error_of([&] { group_partition(moe, 1, 0, 4, false, "r0.pt"); }), "has no ep_size_<N> name"));
}

TEST(UcpFragmentMap, ParameterCutAtAPartitionBoundaryGetsOneFragmentPerPartition) {
  // Two DP ranks of one flat buffer: rank 0 holds a[2,3] and the first 2 elements of b[4], rank 1
  // the last 2 of b (at 0) and c[3].
  const ShapeMap shapes = {{"a", {2, 3}}, {"b", {4}}, {"c", {3}}};
  const auto pset = no_patterns();
  const ExpertFacts experts;
  Zero12FragmentMap map(1, 1, pset, experts);
  ExtractPlan plan;
  plan.files = {"r1.pt", "r0.pt"};
  // Added in file order rank 1 first: the coverage step puts the parts in order.
  map.add(plan, dense_group(0, 1, 2, {{"b", 0, 2}, {"c", 2, 3}}), shapes, "m.pt", "r1.pt");
  map.add(plan, dense_group(1, 0, 2, {{"a", 0, 6}, {"b", 6, 2}}), shapes, "m.pt", "r0.pt");
  ASSERT_EQ(plan.params.size(), 3u);
  EXPECT_EQ(plan.params[0].name, "b");  // the order first seen
  EXPECT_EQ(plan.params[1].name, "c");
  EXPECT_EQ(plan.params[2].name, "a");
  EXPECT_EQ(frags(plan.params[0].fragments[0]), (std::vector<Frag>{{0, 0, 0, 2, 1}, {1, 0, 6, 2, 0}}));
  EXPECT_EQ(plan.params[0].step_file, 0);
  EXPECT_EQ(plan.params[0].states, (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
  check_zero12_coverage(plan, 1, "ckpt");
  EXPECT_EQ(frags(plan.params[0].fragments[0]), (std::vector<Frag>{{1, 0, 6, 2, 0}, {0, 0, 0, 2, 1}}));
  EXPECT_EQ(plan.params[2].tp_shapes, (std::vector<std::vector<int64_t>>{{2, 3}}));
}

TEST(UcpFragmentMap, CoverageRefusesMissingAndDoubledPartitions) {
  const ShapeMap shapes = {{"a", {8}}};
  const auto pset = no_patterns();
  const ExpertFacts experts;
  {
    Zero12FragmentMap map(1, 1, pset, experts);
    ExtractPlan plan;
    plan.files = {"r0.pt"};
    map.add(plan, dense_group(0, 0, 2, {{"a", 0, 4}}), shapes, "m.pt", "r0.pt");
    const std::string m = error_of([&] { check_zero12_coverage(plan, 1, "ckpt"); });
    EXPECT_TRUE(has(m, "ckpt: parameter a tp rank 0: fragments hold 4 elements but its shape [8] needs 8")) << m;
  }
  {
    Zero12FragmentMap map(1, 1, pset, experts);
    ExtractPlan plan;
    plan.files = {"r0.pt", "r0-copy.pt"};
    map.add(plan, dense_group(0, 0, 2, {{"a", 0, 4}}), shapes, "m.pt", "r0.pt");
    map.add(plan, dense_group(1, 0, 2, {{"a", 0, 4}}), shapes, "m.pt", "r0-copy.pt");
    const std::string m = error_of([&] { check_zero12_coverage(plan, 1, "ckpt"); });
    EXPECT_TRUE(has(m, "r0-copy.pt: parameter a appears twice in partition 0")) << m;
  }
}

TEST(UcpFragmentMap, ParameterWithoutShapeIsRefusedNamingTheModelFile) {
  const auto pset = no_patterns();
  const ExpertFacts experts;
  Zero12FragmentMap map(1, 1, pset, experts);
  ExtractPlan plan;
  plan.files = {"r0.pt"};
  const std::string m =
      error_of([&] { map.add(plan, dense_group(0, 0, 1, {{"ghost", 0, 4}}), ShapeMap{}, "mp_rank_00.pt", "r0.pt"); });
  EXPECT_TRUE(has(m, "r0.pt") && has(m, "ghost has no shape in mp_rank_00.pt")) << m;
}

const std::string kExpert1 = "layers.2.mlp.deepspeed_moe.experts.deepspeed_experts.1.w";

TEST(UcpFragmentMap, NativeExpertIsRenamedToItsGlobalId) {
  // MoE layer 0 with 4 experts over EP 2 (2 per EP rank): DP rank 1 of 2 is EP rank 1, so its local
  // expert 1 is global expert 3.
  ExpertFacts experts;
  experts.num_experts = {4};
  experts.moe_layer_of[formats::deepspeed::with_expert_index(kExpert1, 0)] = 0;
  // MoE layer 0's number as read_native_expert_files gives it (its files' names say layers.2).
  experts.layer_number[0] = 2;
  const std::string global3 = "layers.2.mlp.deepspeed_moe.experts.deepspeed_experts.3.w";
  experts.expert_file_of[global3] = "layer_0_expert_3_mp_rank_00_model_states.pt";
  const ShapeMap shapes = {{global3, {2, 2}}};
  const auto pset = no_patterns();
  Zero12FragmentMap map(1, 1, pset, experts);
  ExtractPlan plan;
  plan.files = {"r1.pt"};
  ShardGroup g;
  g.file = 0;
  g.group = 1;
  g.info.moe = true;
  g.info.ep_size = 2;
  g.partition = group_partition(g.info, 1, 1, 2, false, "r1.pt");
  g.fragments = {{kExpert1, 0, 4}};
  g.states = {"fp32"};
  map.add(plan, g, shapes, "m.pt", "r1.pt");
  ASSERT_EQ(plan.params.size(), 1u);
  EXPECT_EQ(plan.params[0].name, global3);
  EXPECT_EQ(plan.params[0].expert, 3);
  EXPECT_EQ(plan.params[0].moe_layer, 2);  // MoE layer 0's number, from its expert files (issue 33)
  EXPECT_EQ(frags(plan.params[0].fragments[0]), (std::vector<Frag>{{0, 1, 0, 4, 0}}));
  // A local index beyond the experts per EP rank is refused.
  g.fragments = {{formats::deepspeed::with_expert_index(kExpert1, 2), 0, 4}};
  EXPECT_TRUE(has(error_of([&] { map.add(plan, g, shapes, "m.pt", "r1.pt"); }), "only 2 experts per EP rank"));
}

// An AutoEP layer of 4 experts over EP 2 (2 local experts).
formats::deepspeed::AutoEpLayer four_experts_ep2(int moe_layer_id, const std::string& prefix) {
  formats::deepspeed::AutoEpLayer a;
  a.moe_layer_id = moe_layer_id;
  a.num_experts = 4;
  a.num_local_experts = 2;
  a.ep_size = 2;
  a.expert_key_prefix = prefix;
  return a;
}

TEST(UcpFragmentMap, AutoEpWeightJoinsEveryEpRankInPartOrder) {
  // AutoEP layer of E = 4 over EP 2, DP 4: expert-DP groups of 2. DP rank d is EP rank d % 2,
  // expert-DP rank d / 2, its partition goes to part ep_rank * 2 + edp.
  ExpertFacts experts;
  experts.autoep = {four_experts_ep2(5, "model.layers.0.mlp.experts")};
  experts.autoep_param["model.layers.0.mlp.experts.w1"] = 0;
  const ShapeMap shapes = {{"model.layers.0.mlp.experts.w1", {2, 3, 2}}};
  const auto pset = no_patterns();
  Zero12FragmentMap map(1, 1, pset, experts);
  ExtractPlan plan;
  for (int d = 0; d < 4; ++d) {
    plan.files.push_back("r" + std::to_string(d) + ".pt");
    ShardGroup g;
    g.file = d;
    g.group = 1;
    g.info.moe = true;
    g.info.ep_size = 2;
    g.partition = group_partition(g.info, 1, d, 4, false, plan.files.back());
    g.fragments = {{"model.layers.0.mlp.experts.w1", 0, 6}};
    g.states = {"fp32"};
    map.add(plan, g, shapes, "m.pt", plan.files.back());
  }
  ASSERT_EQ(plan.params.size(), 1u);
  EXPECT_EQ(plan.params[0].autoep_experts, 4);
  EXPECT_EQ(plan.params[0].moe_layer, 5);
  EXPECT_EQ(plan.params[0].tp_shapes[0], (std::vector<int64_t>{4, 3, 2}));
  check_zero12_coverage(plan, 1, "ckpt");
  // Parts: d0 -> 0 * 2 + 0, d1 -> 1 * 2 + 0, d2 -> 0 * 2 + 1, d3 -> 1 * 2 + 1.
  EXPECT_EQ(frags(plan.params[0].fragments[0]),
            (std::vector<Frag>{{0, 1, 0, 6, 0}, {2, 1, 0, 6, 1}, {1, 1, 0, 6, 2}, {3, 1, 0, 6, 3}}));
}

TEST(UcpFragmentMap, UnusedPatternsAreThoseMatchingNoParameter) {
  const auto pset = patterns::PatternSet::from_json(
      nlohmann::json{{"tp_replicated_parameter_patterns", {"^a$", "^nothing$"}}}, "test");
  const ExpertFacts experts;
  Zero12FragmentMap map(1, 1, pset, experts);
  ExtractPlan plan;
  plan.files = {"r0.pt"};
  map.add(plan, dense_group(0, 0, 1, {{"a", 0, 2}}), ShapeMap{{"a", {2}}}, "m.pt", "r0.pt");
  const auto unused = map.unused_patterns();
  ASSERT_EQ(unused.size(), 1u);
  EXPECT_TRUE(has(unused[0], "nothing")) << unused[0];
}

// ---- ZeRO-3 ----

// Dense sub-group 0 of DP rank d's shard (file index d): partition d of dp.
Zero3SubGroup dense_sub(int d, int dp, std::vector<std::string> states) {
  Zero3SubGroup sub;
  sub.file = d;
  sub.group = 0;
  sub.dp_rank = d;
  sub.partition_count = dp;
  sub.partition_rank = d;
  sub.states = std::move(states);
  sub.has_step = true;
  return sub;
}

TEST(UcpFragmentMap, Zero3SlicesEveryParameterOnItsOwnWithPaddingAtTheEnd) {
  // DP 2: a[5] -> slices of 3 (rank 0: 3, rank 1: 2 + 1 padding), b[3] -> slices of 2 (2, 1 + 1).
  // A rank's flat sub-group: a's slice at 0, b's at 3; 5 elements each.
  const SubGroups tp0 = {{{"a", {5}}, {"b", {3}}}};
  ExtractPlan plan;
  plan.files = {"z0.pt", "z1.pt"};
  const auto index = zero3_params(plan, {tp0}, {}, {}, {"m0.pt"});
  ASSERT_EQ(plan.params.size(), 2u);
  for (int d = 0; d < 2; ++d)
    EXPECT_EQ(add_zero3_subgroup(plan, index, dense_sub(d, 2, {"fp32", "exp_avg"}), tp0[0], {}, {}, 2, "m.pt",
                                 plan.files[d]),
              5);
  check_zero3_coverage(plan, 1, "ckpt");
  EXPECT_EQ(frags(plan.params[0].fragments[0]), (std::vector<Frag>{{0, 0, 0, 3, 0}, {1, 0, 0, 2, 1}}));
  EXPECT_EQ(frags(plan.params[1].fragments[0]), (std::vector<Frag>{{0, 0, 3, 2, 0}, {1, 0, 3, 1, 1}}));
  EXPECT_EQ(plan.params[1].step_file, 0);
  EXPECT_EQ(plan.params[1].states, (std::vector<std::string>{"fp32", "exp_avg"}));
}

TEST(UcpFragmentMap, Zero3RankWithAnEmptySliceGetsNoFragment) {
  // DP 3, a[4]: slices of 2, 2, 0 (rank 2 holds only padding).
  const SubGroups tp0 = {{{"a", {4}}}};
  ExtractPlan plan;
  plan.files = {"z0.pt", "z1.pt", "z2.pt"};
  const auto index = zero3_params(plan, {tp0}, {}, {}, {"m0.pt"});
  for (int d = 0; d < 3; ++d)
    EXPECT_EQ(add_zero3_subgroup(plan, index, dense_sub(d, 3, {"fp32"}), tp0[0], {}, {}, 3, "m.pt", plan.files[d]), 2);
  check_zero3_coverage(plan, 1, "ckpt");
  EXPECT_EQ(frags(plan.params[0].fragments[0]), (std::vector<Frag>{{0, 0, 0, 2, 0}, {1, 0, 0, 2, 1}}));
}

TEST(UcpFragmentMap, Zero3ShardWithOtherStatesOrAMissingRankIsRefused) {
  const SubGroups tp0 = {{{"a", {4}}}};
  ExtractPlan plan;
  plan.files = {"z0.pt", "z1.pt"};
  const auto index = zero3_params(plan, {tp0}, {}, {}, {"m0.pt"});
  add_zero3_subgroup(plan, index, dense_sub(0, 2, {"fp32", "exp_avg"}), tp0[0], {}, {}, 2, "m.pt", "z0.pt");
  const std::string cov = error_of([&] { check_zero3_coverage(plan, 1, "ckpt"); });
  EXPECT_TRUE(has(cov, "ckpt: parameter a: ZeRO-3 slices hold 2 of 4 elements")) << cov;
  const Zero3SubGroup sub = dense_sub(1, 2, {"fp32"});
  const std::string m = error_of([&] { add_zero3_subgroup(plan, index, sub, tp0[0], {}, {}, 2, "m.pt", "z1.pt"); });
  EXPECT_TRUE(has(m, "z1.pt") && has(m, "holds other optimizer states than tp rank 0, dp rank 0")) << m;
}

TEST(UcpFragmentMap, Zero3TpRanksMustListTheSameParameters) {
  const SubGroups tp0 = {{{"a", {4}}, {"b", {2}}}};
  const SubGroups tp1 = {{{"a", {4}}, {"c", {2}}}};
  ExtractPlan plan;
  const std::string m = error_of([&] { zero3_params(plan, {tp0, tp1}, {}, {}, {"m0.pt", "m1.pt"}); });
  EXPECT_TRUE(has(m, "m1.pt") && has(m, "parameter c is not in tp rank 0's param_shapes")) << m;
  ExtractPlan again;
  const auto index = zero3_params(again, {tp0, {{{"a", {4}}, {"b", {3}}}}}, {}, {}, {"m0.pt", "m1.pt"});
  EXPECT_EQ(index.at("b"), 1u);
  EXPECT_EQ(again.params[1].tp_shapes, (std::vector<std::vector<int64_t>>{{2}, {3}}));
}

TEST(UcpFragmentMap, Zero3AutoEpSliceGoesToItsEpRanksPart) {
  // AutoEP under ZeRO-3, E = 4, EP 2, DP 4: the expert sub-group is partitioned over 2 expert-DP ranks.
  // The rank recording EP rank 1, expert-DP rank 1 holds [E_local=2, 3] = 6 elements, slice 1 of 2 (3).
  formats::deepspeed::AutoEpLayer a = four_experts_ep2(0, "m.experts");
  a.ep_rank = 1;
  a.expert_data_parallel_rank = 1;
  a.expert_data_parallel_world_size = 2;
  const std::map<std::string, size_t> autoep_param = {{"m.experts.w1", 0}};
  const SubGroups tp0 = {{{"m.experts.w1", {2, 3}}}};
  ExtractPlan plan;
  plan.files = {"z3.pt"};
  const auto index = zero3_params(plan, {tp0}, {a}, autoep_param, {"m0.pt"});
  EXPECT_EQ(plan.params[0].tp_shapes[0], (std::vector<int64_t>{4, 3}));
  plan.params[0].states = {"fp32"};  // as DP rank 0's shard set them
  Zero3SubGroup sub;
  sub.file = 0;
  sub.group = 0;
  sub.dp_rank = 3;
  sub.partition_count = 2;
  sub.partition_rank = 1;
  sub.autoep_expert = true;
  sub.states = {"fp32"};
  EXPECT_EQ(add_zero3_subgroup(plan, index, sub, tp0[0], {a}, autoep_param, 4, "m3.pt", "z3.pt"), 3);
  EXPECT_EQ(frags(plan.params[0].fragments[0]), (std::vector<Frag>{{0, 0, 0, 3, 3}}));
  // A dense sub-group holding the expert weight is refused.
  sub.autoep_expert = false;
  sub.partition_count = 4;
  sub.partition_rank = 3;
  EXPECT_TRUE(has(error_of([&] { add_zero3_subgroup(plan, index, sub, tp0[0], {a}, autoep_param, 4, "m3.pt", "z3.pt"); }),
                  "is a dense sub-group but holds AutoEP expert weight m.experts.w1"));
}

}  // namespace
}  // namespace fragment_map_test
}  // namespace ucpkit::to_universal
