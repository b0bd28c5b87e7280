// lib/core/exit_release.h: release() frees at once unless the process asked to leave its largest tables to the exit.
#include "core/exit_release.h"

#include <gtest/gtest.h>

namespace exit_release_test {

using namespace ucpkit;

struct Flag {
  bool* destroyed;
  ~Flag() { *destroyed = true; }
};

TEST(ExitRelease, FreedAtOnceUnlessTheToolLeavesItToTheExit) {
  ASSERT_FALSE(release_at_exit());  // a test process (or a library caller) frees as usual
  bool freed = false;
  release(std::unique_ptr<Flag>(new Flag{&freed}));
  EXPECT_TRUE(freed);
  const size_t kept = released_kept();

  static bool kept_destroyed = false;  // outlives the test: the object is kept until the process exits
  set_release_at_exit(true);
  release(std::unique_ptr<Flag>(new Flag{&kept_destroyed}));
  release(std::unique_ptr<Flag>());  // nothing to keep
  set_release_at_exit(false);
  EXPECT_FALSE(kept_destroyed);
  EXPECT_EQ(released_kept(), kept + 1);
}

}  // namespace exit_release_test
