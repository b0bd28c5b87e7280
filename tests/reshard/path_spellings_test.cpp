// Every spelling of a checkpoint path a shell user types names the same checkpoint (issue 28, "paths as
// any CLI takes them"): ucp-load run from inside the tag folder (`--input .`), from its parent with a
// trailing slash, and through a symbolic link to the tag folder writes the same files, under the tag
// the source was saved as (before: `--input .` wrote `latest` = "." and hidden files at the top level).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "formats/deepspeed/checkpoint_dir.h"
#include "formats/deepspeed/file_names.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace path_spellings_test {

namespace fs = std::filesystem;
using ucpkit::testing::file_bytes;
using ucpkit::testing::quote;
using ucpkit::testing::run_capture;
using ucpkit::testing::tree_bytes;

namespace {
const fs::path kSource = fs::path(UCPKIT_FIXTURES_DIR) / "gpt_tp1dp2_to_tp2dp3" / "src";

std::string tag_of_source() {
  std::string t = file_bytes((kSource / "latest").string());
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}
}  // namespace

TEST(PathSpellings, TagOfDirIsTheFolderNameHoweverSpelled) {
  const fs::path work = ucpkit::testing::scratch_dir("path_spellings_unit");
  fs::create_directories(work / "ck" / "global_step7");
  fs::create_directory_symlink("ck/global_step7", work / "current");
  const fs::path cwd = fs::current_path();
  fs::current_path(work / "ck" / "global_step7");
  EXPECT_EQ(ucpkit::formats::deepspeed::tag_of_dir("."), "global_step7");
  EXPECT_EQ(ucpkit::formats::deepspeed::tag_of_dir("./"), "global_step7");
  EXPECT_EQ(ucpkit::formats::deepspeed::tag_of_dir("../global_step7/"), "global_step7");
  EXPECT_EQ(ucpkit::formats::deepspeed::tag_of_dir("../../current"), "global_step7");
  EXPECT_EQ(ucpkit::formats::deepspeed::tag_of_dir("../../current/"), "global_step7");
  fs::current_path(cwd);
  EXPECT_EQ(ucpkit::formats::deepspeed::tag_of_dir("/c/global_step5"), "global_step5");
}

TEST(PathSpellings, UcpLoadWritesTheSameCheckpointForEverySpellingOfItsInput) {
  const std::string tag = tag_of_source();
  ASSERT_FALSE(tag.empty());
  const fs::path work = ucpkit::testing::scratch_dir("path_spellings_load");
  fs::create_directory_symlink(kSource / tag, work / "current");
  const std::string load = kBin + "/ucp-load --dp 3 --no-sync -q ";
  // (where the command runs, --input as typed, --output as typed, output folder)
  struct Spelling {
    fs::path cwd;
    std::string input, output;
    fs::path out;
  };
  const Spelling spellings[] = {
      {kSource / tag, ".", (work / "a").string(), work / "a"},
      {kSource, tag + "/", (work / "b/").string(), work / "b"},
      {work, "current", "c", work / "c"},
      {work, "./current/", "./d/", work / "d"},
  };
  for (const auto& s : spellings) {
    const auto r = run_capture("cd " + quote(s.cwd.string()) + " && " + load + "--input " + quote(s.input) +
                               " --output " + quote(s.output));
    ASSERT_EQ(r.rc, 0) << s.input << ": " << r.out;
    EXPECT_EQ(file_bytes((s.out / "latest").string()), tag) << s.input;
    EXPECT_TRUE(fs::is_directory(s.out / tag)) << s.input;
    for (const auto& e : fs::directory_iterator(s.out))
      EXPECT_NE(e.path().filename().string()[0], '.') << s.input << ": " << e.path();
  }
  // Byte for byte the same checkpoint whichever spelling was used.
  for (const char* o : {"b", "c", "d"}) EXPECT_EQ(tree_bytes((work / "a").string()), tree_bytes((work / o).string())) << o;
}

}  // namespace path_spellings_test
