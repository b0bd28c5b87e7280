// formats/deepspeed/checkpoint_dir on real folders (a scratch dir per test): pointer files as
// DeepSpeed writes them (engine.py save_checkpoint: `latest` holds the tag, no newline; ds_to_universal
// writes `latest_universal`), global_stepN tags, and the kind of a tool's input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "formats/deepspeed/checkpoint_dir.h"
#include "support/errors.h"
#include "support/process.h"

namespace deepspeed_checkpoint_dir_test {

namespace fs = std::filesystem;
using namespace ucpkit::formats::deepspeed;
using ucpkit::testing::error_of;
using ucpkit::testing::scratch_dir;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(CheckpointDir, StepTagsRoundTrip) {
  EXPECT_EQ(step_tag(300), "global_step300");
  EXPECT_EQ(step_of_tag(step_tag(0)), 0);
  EXPECT_EQ(step_of_tag("global_step123456789012345678"), 123456789012345678);
  EXPECT_FALSE(step_of_tag("global_step1234567890123456789"));  // 19 digits: not a step
  EXPECT_FALSE(step_of_tag("best"));
  EXPECT_FALSE(step_of_tag("global_step"));
  EXPECT_FALSE(step_of_tag("global_step-1"));
}

TEST(CheckpointDir, ResolvesTheTagFolderThroughLatestOrTakesItAsGiven) {
  const fs::path root = scratch_dir("checkpoint_dir_resolve");
  fs::create_directories(root / "global_step20");
  write(root / "latest", "global_step20\n");  // a hand-written pointer with a newline
  auto t = resolve_tag_folder(root.string());
  EXPECT_EQ(fs::path(t.dir), root / "global_step20");
  EXPECT_EQ(t.tag, "global_step20");
  EXPECT_EQ(fs::path(t.pointer), root / "latest");
  EXPECT_EQ(fs::path(resolve_checkpoint_dir(root.string())), root / "global_step20");
  // The tag folder itself: no pointer, its own name (also through a trailing slash).
  t = resolve_tag_folder((root / "global_step20").string() + "/");
  EXPECT_EQ(t.tag, "global_step20");
  EXPECT_TRUE(t.pointer.empty());
  // `latest_universal` counts only when asked for, and after `latest`.
  const fs::path uni = scratch_dir("checkpoint_dir_universal");
  fs::create_directories(uni / "global_step7_universal");
  write(uni / kLatestUniversalName, "global_step7_universal");
  EXPECT_TRUE(resolve_tag_folder(uni.string()).pointer.empty());
  t = resolve_tag_folder(uni.string(), {kLatestName, kLatestUniversalName});
  EXPECT_EQ(t.tag, "global_step7_universal");
  EXPECT_EQ(fs::path(t.pointer), uni / kLatestUniversalName);
}

TEST(CheckpointDir, BadPointersAndMissingFoldersNameTheFile) {
  const fs::path root = scratch_dir("checkpoint_dir_bad");
  write(root / "latest", "global_step9");
  EXPECT_NE(error_of([&] { resolve_tag_folder(root.string()); }).find((root / "latest").string() + ": names global_step9"),
            std::string::npos);
  // Anything but one folder name is refused by its size, its content never echoed (issue 32).
  write(root / "latest", "../elsewhere");
  const std::string up = error_of([&] { resolve_tag_folder(root.string()); });
  EXPECT_NE(up.find((root / "latest").string() + ": not a step tag (12 bytes"), std::string::npos) << up;
  EXPECT_EQ(up.find("elsewhere"), std::string::npos) << up;
  write(root / "latest", "  \n");
  EXPECT_NE(error_of([&] { read_pointer((root / "latest").string()); }).find(": not a step tag (3 bytes"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_tag_folder((root / "none").string()); }).find("checkpoint folder not found"),
            std::string::npos);
}

TEST(CheckpointDir, CompletedStepWaitsForTheTagFolder) {
  const fs::path root = scratch_dir("checkpoint_dir_completed");
  EXPECT_FALSE(completed_step(root.string()));  // no `latest` yet
  write(root / "latest", "global_step5");
  EXPECT_FALSE(completed_step(root.string()));  // names a folder not yet there
  fs::create_directories(root / "global_step5");
  EXPECT_EQ(completed_step(root.string()), 5);
  write(root / "latest", "best");  // a custom tag: no step
  fs::create_directories(root / "best");
  EXPECT_FALSE(completed_step(root.string()));
}

TEST(CheckpointDir, WriteLatestWritesTheTagAsDeepSpeedDoes) {
  const fs::path root = scratch_dir("checkpoint_dir_write");
  write_latest(root.string(), "global_step3");
  EXPECT_EQ(read(root / "latest"), "global_step3");
  EXPECT_FALSE(fs::exists(root / kLatestUniversalName));
  write_latest(root.string(), "global_step4", true, true);
  EXPECT_EQ(read(root / "latest"), "global_step4");
  EXPECT_EQ(read(root / kLatestUniversalName), "global_step4");
}

}  // namespace deepspeed_checkpoint_dir_test
