// Two-step mode accepted fragments of another step (issue 32, WEAK "cross-checks"): a ucp-extract
// work folder whose fragment files were copied from the extract of another save converted with exit 0
// into a universal checkpoint mixing the two. ucp-extract now stamps each fragment with the tag of
// its save, and ucp-union refuses a fragment whose stamp is not the one plan.json records: exit 1,
// one line naming the fragment folder, nothing written. Run as job scripts do: relative paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace two_step_source_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;

TEST(TwoStepSource, FragmentsOfAnotherSaveAreRefused) {
  const fs::path d = ucpkit::testing::scratch_dir("two_step_source");
  // Two saves of the fixture: global_step10 and the same files under the tag retry10.
  fs::copy(kFx + "/gpt", d / "a", fs::copy_options::recursive);
  fs::copy(kFx + "/gpt", d / "b", fs::copy_options::recursive);
  fs::rename(d / "b" / "global_step10", d / "b" / "retry10");
  std::ofstream(d / "b" / "latest", std::ios::trunc) << "retry10";
  const std::string cd = "cd " + quote(d.string()) + " && ";
  std::string log;
  ASSERT_EQ(run_command(cd + kBin + "/ucp-extract -q --no-sync --input a --output wa", &log), 0) << log;
  ASSERT_EQ(run_command(cd + kBin + "/ucp-extract -q --no-sync --input b --output wb", &log), 0) << log;
  // Each work folder converts as it is.
  ASSERT_EQ(run_command(cd + kBin + "/ucp-union -q --no-sync --input wa --output ua", &log), 0) << log;
  ASSERT_EQ(run_command(cd + kBin + "/ucp-union -q --no-sync --input wb --output ub", &log), 0) << log;

  // One parameter's fragments taken from the other save.
  std::string victim;
  for (const auto& e : fs::directory_iterator(d / "wa" / "fragments")) victim = e.path().filename().string();
  ASSERT_FALSE(victim.empty());
  fs::remove_all(d / "wa" / "fragments" / victim);
  fs::copy(d / "wb" / "fragments" / victim, d / "wa" / "fragments" / victim, fs::copy_options::recursive);
  EXPECT_EQ(run_command(cd + kBin + "/ucp-union -q --no-sync --input wa --output ux", &log), 1) << log;
  EXPECT_NE(log.find("wa/fragments/" + victim), std::string::npos) << "the fragment folder is not named: " << log;
  EXPECT_NE(log.find("fragment of retry10, but the work folder's plan.json is of global_step10"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "not one line: " << log;
  EXPECT_FALSE(fs::exists(d / "ux"));
  fs::remove_all(d);
}

}  // namespace two_step_source_test
