// The common state rewritten for a target layout (formats/megatron_core/common_edit.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "formats/megatron_core/common_edit.h"
#include "formats/megatron_core/config.h"
#include "io/pickle/value.h"

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
