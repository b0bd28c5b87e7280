// latest_universal was written after the final fsync and never synced (issue 32, WEAK "durability"):
// a power cut after exit 0 could leave the output in place without its tag, or an empty tag. It is
// now written through the durable atomic-file path: the temporary file fsynced before its rename, the
// folder fsynced after it. Checked with strace (skipped where strace is missing or cannot trace).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace latest_universal_sync_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST(LatestUniversalSync, TagIsFsyncedAndItsFolderAfterTheRename) {
  std::string log;
  if (run_command("strace -f -o /dev/null true", &log) != 0) GTEST_SKIP() << "strace cannot run here: " << log;
  const fs::path d = ucpkit::testing::scratch_dir("latest_universal_sync");
  fs::copy(kFx + "/gpt", d / "gpt", fs::copy_options::recursive);
  // As a job script: relative paths, from the folder that holds the checkpoint.
  ASSERT_EQ(run_command("cd " + quote(d.string()) +
                            " && strace -f -y -o trace.txt -e trace=fsync,fdatasync,rename,renameat,renameat2 " + kBin +
                            "/ucp-union -q --input gpt --output u",
                        &log),
            0)
      << log;
  ASSERT_TRUE(fs::exists(d / "latest_universal"));
  EXPECT_EQ(slurp(d / "latest_universal"), "u");
  std::istringstream trace(slurp(d / "trace.txt"));
  const std::string folder = fs::canonical(d).string();
  bool file_synced = false, renamed = false, folder_synced_after = false;
  for (std::string line; std::getline(trace, line);) {
    const bool sync = line.find("fsync(") != std::string::npos || line.find("fdatasync(") != std::string::npos;
    if (sync && line.find("latest_universal") != std::string::npos && !renamed) file_synced = true;
    if (line.find("rename") != std::string::npos && line.find("/latest_universal\"") != std::string::npos &&
        line.find("= 0") != std::string::npos)
      renamed = true;
    if (sync && renamed && line.find("<" + folder + ">") != std::string::npos) folder_synced_after = true;
  }
  EXPECT_TRUE(file_synced) << "latest_universal not fsynced before its rename:\n" << slurp(d / "trace.txt");
  EXPECT_TRUE(renamed) << slurp(d / "trace.txt");
  EXPECT_TRUE(folder_synced_after) << "the folder not fsynced after latest_universal's rename:\n" << slurp(d / "trace.txt");
  fs::remove_all(d);
}

}  // namespace latest_universal_sync_test
