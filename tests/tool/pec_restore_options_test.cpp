// tool::PecRestoreOptions::check: pec-restore's rules on its options, with the messages the tool
// prints (exit 2), and the library options it fills (docs/commands.md, docs/pec.md).
#include <gtest/gtest.h>

#include "refusal.h"
#include "tool/pec_restore.h"

namespace pec_restore_options_test {

using ucpkit::testing::refusal;
using ucpkit::tool::PecRestoreOptions;

TEST(PecRestoreOptions, MemoryInWholeMiBNamedAsTyped) {
  PecRestoreOptions o;
  o.memory = 1536 << 10;
  EXPECT_EQ(refusal(o), "--memory 1536K: give whole MiB (e.g. 256M)");
  o.args = {"--memory-mb", "1.5"};
  EXPECT_EQ(refusal(o), "--memory-mb gives 1536K: give whole MiB (e.g. 256M)");
  o.memory = 64 << 20;
  o.check();
  EXPECT_EQ(o.restore.memory_mb, 64u);
}

TEST(PecRestoreOptions, PltThresholdAndCapacityFactor) {
  PecRestoreOptions o;
  o.restore.plt_threshold = -0.01;
  EXPECT_EQ(refusal(o), "--plt-threshold must be >= 0");
  o.restore.plt_threshold = 0;
  o.restore.capacity_factor = 0.99;
  EXPECT_EQ(refusal(o), "--capacity-factor must be >= 1");
  o.restore.capacity_factor = 1;
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(PecRestoreOptions, FillsTheStep) {
  PecRestoreOptions o;
  o.step = 300;
  o.check();
  EXPECT_EQ(o.restore.step, 300);
  EXPECT_EQ(o.restore.memory_mb, 256u);  // the default --memory 256M
}

}  // namespace pec_restore_options_test
