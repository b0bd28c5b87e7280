// The common state rewritten for a target layout (formats/megatron_core/common_edit.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/config.h"
#include "io/pickle/value.h"

namespace megatron_core_common_edit_test {

using namespace ucpkit;
using pickle::Kind;
using pickle::Value;

namespace {

pickle::ValuePtr common_with_args() {
  auto args = Value::make_object("argparse", "Namespace", Value::tuple(), Value::dict(), pickle::Object::Build::NewObj);
  args->set_attr("tensor_model_parallel_size", Value::integer(2));
  args->set_attr("pipeline_model_parallel_size", Value::integer(1));
  args->set_attr("no_save_rng", Value::boolean(false));  // the source saved its RNG state
  auto common = Value::dict();
  common->set_item("args", args);
  return common;
}

}  // namespace

// Megatron's default load_checkpoint asks for rng_state/shard_<pp>.<tp> whenever the args' TP and PP
// equal the run's and no_save_rng is false (training/checkpointing.py:2170-2193, core_v0.19.0); the
// writer writes no RNG state, so the args it writes say so (issue 47: "Missing key ... rng_state").
TEST(McoreCommonEdit, TargetLayoutSetsTheSizesAndSaysNoRngStateIsSaved) {
  auto common = common_with_args();
  formats::megatron_core::set_target_layout(common, 1, 2, 1, 4, 1, "common.pt");
  const auto args = common->get("args");
  EXPECT_EQ(args->attr("tensor_model_parallel_size")->i, 1);
  EXPECT_EQ(args->attr("pipeline_model_parallel_size")->i, 2);
  EXPECT_EQ(args->attr("data_parallel_size")->i, 4);
  EXPECT_EQ(args->attr("world_size")->i, 8);
  ASSERT_TRUE(args->attr("no_save_rng"));
  ASSERT_TRUE(args->attr("no_save_rng")->is(Kind::Bool));
  EXPECT_TRUE(args->attr("no_save_rng")->b);
}

// Where a release keeps the common state (issue 47, --megatron-version): common.pt before 0.17.
TEST(McoreCommonEdit, ReleasesBefore017WriteCommonPt) {
  using formats::megatron_core::writes_legacy_common;
  for (const char* v : {"0.16", "0.16.1", "0.15.3", "0.9.0"}) EXPECT_TRUE(writes_legacy_common(v)) << v;
  for (const char* v : {"0.17", "0.17.0", "0.19.0", "0.19.0rc1", "0.19.2", "1.0"}) EXPECT_FALSE(writes_legacy_common(v)) << v;
  for (const char* v : {"", "v0.16", "0", "0.x", "0.16-", "latest"}) EXPECT_THROW(writes_legacy_common(v), UsageError) << v;
}

namespace {

// A common state with one unchained optimizer part whose groups are `expert_flags` (is_expert_parallel
// of each group, or none when the group has no such key).
pickle::ValuePtr moe_common(const std::vector<int>& expert_flags) {
  auto common = common_with_args();
  common->get("args")->set_attr("num_experts", Value::integer(4));
  std::vector<pickle::ValuePtr> groups;
  for (size_t i = 0; i < expert_flags.size(); ++i) {
    auto g = Value::dict();
    g->set_item("wd_mult", Value::real(i % 2 ? 0.0 : 1.0));
    if (expert_flags[i] >= 0) g->set_item("is_expert_parallel", Value::boolean(expert_flags[i] == 1));
    groups.push_back(g);
  }
  auto opt = Value::dict();
  opt->set_item("param_groups", Value::list(std::move(groups)));
  auto part = Value::dict();
  part->set_item("optimizer", opt);
  common->set_item("optimizer", part);
  return common;
}

std::vector<bool> expert_flags_of(const pickle::ValuePtr& part) {
  std::vector<bool> out;
  for (const auto& g : part->get("optimizer")->get("param_groups")->items) out.push_back(g->get("is_expert_parallel")->b);
  return out;
}

}  // namespace

// EP > 1 needs Megatron's ChainedOptimizer {0: dense, 1: expert}. A part that already holds expert
// groups (a Hugging Face import's fresh state) is split by them; a dense source's part is copied with
// its groups marked expert-parallel.
TEST(McoreCommonEdit, TheExpertPartIsSplitOffOrCopied) {
  auto split = moe_common({0, 0, 1, 1});
  formats::megatron_core::set_target_layout(split, 2, 1, 2, 2, 1, "common.pt");
  const auto chained = split->get("optimizer");
  ASSERT_EQ(chained->entries.size(), 2u);
  EXPECT_EQ(expert_flags_of(chained->entries[0].second), (std::vector<bool>{false, false}));
  EXPECT_EQ(expert_flags_of(chained->entries[1].second), (std::vector<bool>{true, true}));
  EXPECT_EQ(split->get("args")->attr("expert_tensor_parallel_size")->i, 1);

  auto copied = moe_common({-1, -1});
  formats::megatron_core::set_target_layout(copied, 2, 1, 2, 2, 1, "common.pt");
  const auto parts = copied->get("optimizer");
  ASSERT_EQ(parts->entries.size(), 2u);
  EXPECT_EQ(parts->entries[0].second->get("optimizer")->get("param_groups")->items.size(), 2u);
  EXPECT_FALSE(parts->entries[0].second->get("optimizer")->get("param_groups")->items[0]->contains("is_expert_parallel"));
  EXPECT_EQ(expert_flags_of(parts->entries[1].second), (std::vector<bool>{true, true}));
}

}  // namespace megatron_core_common_edit_test
