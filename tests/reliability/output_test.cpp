// An output equal to, inside, or holding an input (issue "Reliability" item 3): with --overwrite the
// commit replaced the source (ucp-union, ucp-load), and moe-replace --output = --loads replaced the
// loads. Every such pair is refused before anything is read or written (usage error, exit 2), the
// input left byte for byte as it was; an output beside the checkpoint folder stays allowed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "support/paths.h"
#include "support/process.h"
#include "support/files.h"

namespace output_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;
using ucpkit::testing::scratch_dir;

using ucpkit::testing::file_bytes;

namespace {

// Every regular file under `dir` (relative name -> content).
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = file_bytes(e.path());
  return out;
}

// A private copy of the generated checkpoint (parent folder with `latest` and global_step10/).
fs::path copy_checkpoint(const fs::path& d) {
  fs::copy(kFx + "/gpt", d / "ck", fs::copy_options::recursive);
  return d / "ck";
}

// Runs `cmd`, expects a usage error naming `word` ("is", "lies inside", "holds"), and `keep` unchanged.
void expect_refused(const std::string& cmd, const fs::path& keep, const std::string& word) {
  const auto before = tree(keep);
  ASSERT_FALSE(before.empty());
  std::string log;
  EXPECT_EQ(run_command(cmd, &log), 2) << log;
  EXPECT_NE(log.find(" " + word + " --"), std::string::npos) << log;
  EXPECT_NE(log.find("writing it would replace"), std::string::npos) << log;
  ASSERT_TRUE(fs::exists(keep)) << "the input is gone: " << log;
  EXPECT_TRUE(tree(keep) == before) << "the input changed: " << log;
}

std::string union_cmd(const fs::path& in, const fs::path& out) {
  return kBin + "/ucp-union -q --no-sync --overwrite --input " + quote(in.string()) + " --output " + quote(out.string());
}

std::string load_cmd(const fs::path& in, const fs::path& out) {
  return kBin + "/ucp-load -q --no-sync --overwrite --tp 1 --pp 1 --dp 2 --zero-stage 1 --input " + quote(in.string()) +
         " --output " + quote(out.string());
}

}  // namespace

TEST(OutputOverInput, UnionOntoItsCheckpoint) {
  const fs::path d = scratch_dir("ooi_union");
  const fs::path ck = copy_checkpoint(d);
  expect_refused(union_cmd(ck, ck), ck, "holds");                                  // the parent: holds global_step10
  expect_refused(union_cmd(ck / "global_step10", ck / "global_step10"), ck, "is");  // the step folder itself
  expect_refused(union_cmd(ck, ck / "global_step10" / "u"), ck, "lies inside");
  // Through a symbolic link to the same folder.
  fs::create_directory_symlink(ck, d / "alias");
  expect_refused(union_cmd(ck, d / "alias" / "global_step10"), ck, "is");
  // Beside the step folder under the checkpoint's parent (ds_to_universal's place) is fine.
  std::string log;
  EXPECT_EQ(run_command(union_cmd(ck, ck / "global_step10_universal"), &log), 0) << log;
  EXPECT_TRUE(fs::exists(ck / "global_step10_universal" / "manifest.json"));
  fs::remove_all(d);
}

TEST(OutputOverInput, UnionOntoItsWorkFolder) {
  const fs::path d = scratch_dir("ooi_work");
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-extract -q --no-sync --input " + kFx + "/gpt --output " + quote((d / "w").string()), &log), 0)
      << log;
  expect_refused(union_cmd(d / "w", d / "w"), d / "w", "is");
  const fs::path ck = copy_checkpoint(d);
  expect_refused(kBin + "/ucp-extract -q --no-sync --input " + quote(ck.string()) + " --output " +
                     quote((ck / "global_step10" / "w").string()),
                 ck, "lies inside");
  fs::remove_all(d);
}

TEST(OutputOverInput, LoadOntoItsUniversalCheckpoint) {
  const fs::path d = scratch_dir("ooi_load");
  std::string log;
  ASSERT_EQ(run_command(kBin + "/ucp-union -q --no-sync --input " + kFx + "/gpt --output " + quote((d / "u").string()), &log), 0)
      << log;
  expect_refused(load_cmd(d / "u", d / "u"), d / "u", "is");
  expect_refused(load_cmd(d / "u", d), d / "u", "holds");
  expect_refused(load_cmd(d / "u", d / "u" / "t"), d / "u", "lies inside");
  EXPECT_EQ(run_command(load_cmd(d / "u", d / "t"), &log), 0) << log;
  fs::remove_all(d);
}

TEST(OutputOverInput, PlacementOntoItsLoads) {
  const fs::path d = scratch_dir("ooi_place");
  const fs::path loads = d / "loads.json";
  std::ofstream(loads) << "[[10, 20, 30, 40]]\n";
  const std::string base = kBin + "/moe-replace -q --nodes 2 --gpus-per-node 2 --slots-per-gpu 2 --loads " + quote(loads.string());
  expect_refused(base + " --output " + quote(loads.string()), d, "is");
  expect_refused(base + " --output " + quote((d / "plan.json").string()) + " --svg " + quote(loads.string()), d, "is");
  expect_refused(base + " --output " + quote((d / "plan.json").string()) + " --svg " + quote((d / "plan.json").string()), d,
                 "is");
  std::string log;
  EXPECT_EQ(run_command(base + " --output " + quote((d / "plan.json").string()), &log), 0) << log;
  fs::remove_all(d);
}

}  // namespace output_test
