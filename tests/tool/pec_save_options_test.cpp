// tool::PecSaveOptions::check: pec-save's rules between options, with the messages the tool prints
// (exit 2), and the library options it fills (docs/commands.md, docs/pec.md).
#include <gtest/gtest.h>

#include "refusal.h"
#include "tool/pec_save.h"

namespace pec_save_options_test {

using ucpkit::testing::refusal;
using ucpkit::tool::PecSaveOptions;

namespace {

PecSaveOptions save(const std::string& policy = "sequential") {
  PecSaveOptions o;
  o.save.checkpoint = "ck";
  o.save.store = "store";
  o.save.policy = policy;
  return o;
}

}  // namespace

TEST(PecSaveOptions, ABudgetNeedsTheBudgetPolicyNamedAsTyped) {
  auto o = save();
  o.budget = 32 << 10;
  EXPECT_EQ(refusal(o), "--budget needs --policy budget");
  o.args = {"--budget-bytes", "32768"};
  EXPECT_EQ(refusal(o), "--budget-bytes needs --policy budget");
  // a budget from the host bandwidth: the message names the options given, not --budget
  o = save();
  o.bandwidth = 1e6, o.iteration_seconds = 2;
  EXPECT_EQ(refusal(o), "--bandwidth/--iteration-seconds need --policy budget");
  o.save.policy = "budget";
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(PecSaveOptions, BandwidthAndIterationTimeGoTogetherInsteadOfABudget) {
  auto o = save("budget");
  o.bandwidth = 1e6;
  EXPECT_EQ(refusal(o), "--bandwidth and --iteration-seconds go together");
  o.bandwidth = 0, o.iteration_seconds = 1;
  EXPECT_EQ(refusal(o), "--bandwidth and --iteration-seconds go together");
  o.bandwidth = 1e6;
  o.budget = 1024;
  o.args = {"--budget-bytes", "1024"};
  EXPECT_EQ(refusal(o), "give --budget-bytes or --bandwidth/--iteration-seconds, not both");
  o.budget = 0;
  o.check();
  EXPECT_EQ(o.save.budget_bytes, 1000000u);  // 1e6 B/s x 1 s
}

TEST(PecSaveOptions, ChunkAtLeast4K) {
  auto o = save();
  o.chunk = 4095;
  EXPECT_EQ(refusal(o), "--chunk 4095: must be at least 4K");
  o.args = {"--chunk-mib", "0.0039053"};
  EXPECT_EQ(refusal(o), "--chunk-mib gives 4095: must be at least 4K");
  o.chunk = 4096;
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(PecSaveOptions, WatchReplacesTheCheckpointAndTheStepAndTakesNoPlan) {
  auto o = save();
  o.watch.dir = "job";
  EXPECT_EQ(refusal(o), "--watch replaces --checkpoint and --step");
  o.args = {"--input", "ck"};
  EXPECT_EQ(refusal(o), "--watch replaces --input and --step");
  o = save();
  o.save.checkpoint.clear();
  o.watch.dir = "job";
  o.step = 7;
  EXPECT_EQ(refusal(o), "--watch replaces --checkpoint and --step");
  o.step = -1;
  EXPECT_EQ(refusal(o), "accepted");
  o.plan = true;
  EXPECT_EQ(refusal(o), "--watch and --plan do not go together");
  o.plan = false, o.dry_run = true;
  EXPECT_EQ(refusal(o), "--watch and --dry-run do not go together");
}

TEST(PecSaveOptions, ACheckpointIsRequiredWithoutWatch) {
  auto o = save();
  o.save.checkpoint.clear();
  EXPECT_EQ(refusal(o), "--checkpoint is required (or --watch)");
}

TEST(PecSaveOptions, FillsTheLibraryOptions) {
  auto o = save("budget");
  o.budget = 2 << 20;
  o.chunk = 64 << 10;
  o.step = 100;
  o.no_bootstrap = true;
  o.dry_run = true;  // a dry run is computed from the plan
  o.check();
  EXPECT_EQ(o.save.budget_bytes, 2u << 20);
  EXPECT_EQ(o.save.chunk_bytes, 64u << 10);
  EXPECT_EQ(o.save.step, 100);
  EXPECT_FALSE(o.save.bootstrap);
  EXPECT_TRUE(o.save.plan_only);
}

}  // namespace pec_save_options_test
