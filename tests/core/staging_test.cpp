// core/staging: a staged folder becomes the target only at commit; it is removed on failure; a target
// that exists (or appears mid-run) is kept unless --overwrite; leftovers of dead runs are swept and
// those of live processes are not.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "core/error.h"
#include "core/staging.h"
#include "files.h"
#include "support/process.h"

namespace staging_test {

using namespace ucpkit;
using coretest::entries;
using coretest::slurp;
namespace fs = std::filesystem;

namespace {

// The pid of a process that has exited and been reaped (no process has it for a while).
pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int status = 0;
  ::waitpid(p, &status, 0);
  return p;
}

}  // namespace

TEST(Staging, CommitMakesTheFolderTheTarget) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_commit");
  const fs::path target = dir / "out";
  {
    StagingDir s(target, false, "ucp", {}, /*durable=*/true);
    EXPECT_TRUE(fs::is_directory(s.path()));
    EXPECT_EQ(s.path().parent_path(), target.parent_path());
    std::ofstream(s.path() / "f.txt") << "data";
    EXPECT_FALSE(fs::exists(target));
    s.commit();
  }
  EXPECT_EQ(slurp(target / "f.txt"), "data");
  EXPECT_EQ(entries(dir), 1u);
}

TEST(Staging, FailureRemovesTheFolder) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_fail");
  try {
    StagingDir s(dir / "out", false, "ucp");
    std::ofstream(s.path() / "f.txt") << "data";
    throw std::runtime_error("failed mid-run");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(entries(dir), 0u);
}

TEST(Staging, ExistingTargetRefusedWithoutOverwriteReplacedWithIt) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_existing");
  const fs::path target = dir / "out";
  fs::create_directory(target);
  std::ofstream(target / "manifest.json") << "old";  // an output of ours: --overwrite may replace it
  EXPECT_ANY_THROW(StagingDir(target, false, "ucp"));
  EXPECT_EQ(slurp(target / "manifest.json"), "old");
  {
    StagingDir s(target, true, "ucp");
    std::ofstream(s.path() / "new.txt") << "new";
    s.commit();
  }
  EXPECT_FALSE(fs::exists(target / "manifest.json"));
  EXPECT_EQ(slurp(target / "new.txt"), "new");
  EXPECT_EQ(entries(dir), 1u) << "the old target or the staging folder was left beside the new one";
}

TEST(Staging, TargetAppearingMidRunIsKeptAndCommitFails) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_race");
  const fs::path target = dir / "out";
  StagingDir s(target, false, "ucp");
  std::ofstream(s.path() / "mine.txt") << "mine";
  fs::create_directory(target);
  std::ofstream(target / "theirs.txt") << "theirs";
  EXPECT_THROW(s.commit(), Error);
  EXPECT_EQ(slurp(target / "theirs.txt"), "theirs");
  EXPECT_FALSE(fs::exists(target / "mine.txt"));
}

TEST(Staging, SweepRemovesDeadRunsLeftoversOnly) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_sweep");
  const fs::path target = dir / "out";
  const fs::path dead = dir / (".out.ucp-tmp-" + std::to_string(dead_pid()));
  const fs::path live = dir / (".out.ucp-tmp-" + std::to_string(::getppid()));
  const fs::path other_tag = dir / (".out.pec-tmp-" + std::to_string(dead_pid()));
  const fs::path other_target = dir / (".outx.ucp-tmp-" + std::to_string(dead_pid()));
  for (const auto& p : {dead, live, other_tag, other_target}) fs::create_directory(p);
  std::vector<std::string> notes;
  sweep_stale_staging(target, "ucp", [&](const std::string& n) { notes.push_back(n); });
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live)) << "a live process's staging folder was removed";
  EXPECT_TRUE(fs::exists(other_tag));
  EXPECT_TRUE(fs::exists(other_target));
  EXPECT_EQ(notes.size(), 1u);
}

TEST(Staging, OldCopyOfADeadRunIsKeptWhenItIsTheOnlyCopy) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_old");
  const fs::path target = dir / "out";
  const fs::path old = dir / (".out.ucp-old-" + std::to_string(dead_pid()));
  fs::create_directory(old);
  sweep_stale_staging(target, "ucp");
  EXPECT_TRUE(fs::exists(old)) << "the only copy of the output was removed";
  fs::create_directory(target);
  sweep_stale_staging(target, "ucp");
  EXPECT_FALSE(fs::exists(old));
}

// --overwrite replaces an empty folder or a checkpoint, never a folder of other files (issue 45).
TEST(Staging, OnlyAnEmptyFolderOrACheckpointIsReplaceable) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_replaceable");
  EXPECT_EQ(not_replaceable(dir / "absent"), "");
  fs::create_directory(dir / "empty");
  EXPECT_EQ(not_replaceable(dir / "empty"), "");
  for (const char* marker : {"manifest.json", "latest", ".metadata", "global_step10", "model.safetensors", "__0_0.distcp",
                             "iter_0000002", "mp_rank_00_model_states.pt"}) {
    const fs::path ck = dir / (std::string("ck_") + marker);
    fs::create_directories(ck);
    std::ofstream(ck / marker) << "x";
    EXPECT_EQ(not_replaceable(ck), "") << marker;
  }
  fs::create_directory(dir / "mine");
  std::ofstream(dir / "mine" / "thesis.tex") << "x";
  EXPECT_EQ(not_replaceable(dir / "mine"), "holds no checkpoint (1 entry: thesis.tex)");
  std::ofstream(dir / "file") << "x";
  EXPECT_EQ(not_replaceable(dir / "file"), "is not a folder");
  EXPECT_THROW(StagingDir(dir / "mine", true, "ucp"), Error);
  EXPECT_TRUE(fs::exists(dir / "mine" / "thesis.tex"));
}

// Scratch folders named <prefix><pid>... of a process that is gone are removed; a live one's, and
// names that only look alike, are kept (issue 45: ucp-load's scratch copy, ucp-diff's folder).
TEST(Staging, StalePidFoldersOfGoneProcessesAreSwept) {
  const fs::path dir = ucpkit::testing::scratch_dir("staging_pid_sweep");
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getppid());
  for (const std::string& n : {"ucp-diff-" + dead + "-abc", "ucp-diff-" + live + "-abc", "ucp-diff-" + dead,
                               "ucp-diff-x" + dead, "other-" + dead})
    fs::create_directory(dir / n);
  std::vector<std::string> notes;
  sweep_stale_pid_folders(dir, "ucp-diff-", [&](const std::string& n) { notes.push_back(n); });
  EXPECT_FALSE(fs::exists(dir / ("ucp-diff-" + dead + "-abc")));
  EXPECT_FALSE(fs::exists(dir / ("ucp-diff-" + dead)));
  EXPECT_TRUE(fs::exists(dir / ("ucp-diff-" + live + "-abc")));
  EXPECT_TRUE(fs::exists(dir / ("ucp-diff-x" + dead)));
  EXPECT_TRUE(fs::exists(dir / ("other-" + dead)));
  EXPECT_EQ(notes.size(), 2u);
}

}  // namespace staging_test
