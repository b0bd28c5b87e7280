// formats::detect (issue 46): the one answer to "what is this folder?". Each kind is recognised by
// the marker its format registered (formats/<f>/folder_format.cpp); an unknown folder is one error
// listing what every format looks for; a format registered from outside lib/ (a toy, as a new format
// would) is recognised with nothing else changed.
#include "formats/detect.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "formats/looked_for.h"
#include "support/errors.h"
#include "support/process.h"

namespace detect_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using ucpkit::testing::error_of;

namespace {

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string kind_of(const fs::path& p) { return formats::detect(p.string()).name(); }

[[maybe_unused]] const bool kToy = formats::register_folder_format(
    {"toy", 5, "TOY_CHECKPOINT (toy test format)",
     [](const std::string& dir) -> std::optional<std::string> {
       if (!fs::exists(fs::path(dir) / "TOY_CHECKPOINT")) return std::nullopt;
       return std::string();
     },
     formats::entry_names({"TOY_CHECKPOINT"})});

}  // namespace

TEST(Detect, EachKindByItsMarker) {
  const fs::path d = ucpkit::testing::scratch_dir("detect_kinds");
  write(d / "u" / "manifest.json", "{}");
  write(d / "w" / "plan.json", "{}");
  write(d / "s" / "PEC_STORE", "");
  write(d / "ds" / "latest", "global_step1");
  write(d / "ds" / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", "");
  write(d / "tag" / "mp_rank_00_model_states.pt", "");
  write(d / "dcp" / ".metadata", "");
  write(d / "local" / "__0.metadata", "");
  write(d / "td" / "metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  write(d / "td" / ".metadata", "");
  write(d / "root" / "latest_checkpointed_iteration.txt", "5");
  write(d / "root" / "iter_0000005" / "metadata.json", R"({"sharded_backend": "torch_dist", "sharded_backend_version": 1})");
  write(d / "root" / "iter_0000005" / ".metadata", "");
  EXPECT_EQ(kind_of(d / "u"), "universal");
  EXPECT_EQ(kind_of(d / "w"), "work-folder");
  EXPECT_EQ(kind_of(d / "s"), "pec-store");
  EXPECT_EQ(kind_of(d / "ds"), "deepspeed");
  EXPECT_EQ(kind_of(d / "tag"), "deepspeed");
  EXPECT_EQ(kind_of(d / "dcp"), "dcp");
  EXPECT_EQ(formats::detect((d / "local").string()).format, "dcp");
  EXPECT_EQ(kind_of(d / "local"), "dcp-rank-local");
  EXPECT_EQ(kind_of(d / "td"), "torch_dist");
  EXPECT_EQ(kind_of(d / "root"), "torch_dist");  // a save root: its tracker names the iteration
  EXPECT_TRUE(formats::is_kind((d / "u").string(), formats::kUniversal));
  EXPECT_FALSE(formats::is_kind((d / "u").string(), formats::kDcp));
}

TEST(Detect, UnknownFolderNamesWhatWasLookedFor) {
  const fs::path d = ucpkit::testing::scratch_dir("detect_unknown");
  write(d / "junk" / "readme.txt", "hi");
  write(d / "afile", "x");
  const std::string e = error_of([&] { formats::detect((d / "junk").string()); });
  EXPECT_NE(e.find("junk: not a checkpoint ucpkit reads: no "), std::string::npos) << e;
  for (const char* looked : {"manifest.json (universal)", "PEC_STORE (PEC store)", "plan.json (ucp-extract work folder)",
                             "metadata.json (Megatron-Core torch_dist)", ".metadata (PyTorch DCP)",
                             "latest or *_model_states.pt / *_optim_states.pt (DeepSpeed)", "TOY_CHECKPOINT"})
    EXPECT_NE(e.find(looked), std::string::npos) << looked << " in " << e;
  EXPECT_FALSE(formats::try_detect((d / "junk").string()));
  EXPECT_NE(error_of([&] { formats::detect((d / "none").string()); }).find("none: no such folder"), std::string::npos);
  EXPECT_NE(error_of([&] { formats::detect((d / "afile").string()); }).find("afile: not a folder"), std::string::npos);
  // A DeepSpeed `latest` naming no folder: refused naming the pointer (not "not a checkpoint").
  write(d / "dangling" / "latest", "global_step9");
  EXPECT_NE(error_of([&] { formats::detect((d / "dangling").string()); }).find("latest: names global_step9, which is not a folder"),
            std::string::npos);
  // A `latest` folder (not a pointer file) marks nothing.
  fs::create_directories(d / "latestdir" / "latest");
  EXPECT_FALSE(formats::try_detect((d / "latestdir").string()));
}

TEST(Detect, AFormatRegisteredOutsideTheLibraryIsRecognised) {
  const fs::path d = ucpkit::testing::scratch_dir("detect_toy");
  write(d / "t" / "TOY_CHECKPOINT", "");
  EXPECT_EQ(kind_of(d / "t"), "toy");
  const auto names = formats::folder_formats();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), "toy");  // asked first: order 5
  EXPECT_TRUE(formats::is_checkpoint_entry("TOY_CHECKPOINT"));  // --overwrite may replace its folder
}

TEST(Detect, CheckpointEntriesAreTheRegisteredFormatsNames) {
  for (const char* n : {"manifest.json", "plan.json", "latest", "latest_universal", ".metadata", "metadata.json",
                        "common.pt", "model.safetensors.index.json", "ucpkit_layout.json",
                        "latest_checkpointed_iteration.txt", "global_step5", "iter_0000005", "mp_rank_00_model_states.pt",
                        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "__0_0.distcp", "model-00001.safetensors", "x.pt"})
    EXPECT_TRUE(formats::is_checkpoint_entry(n)) << n;
  for (const char* n : {"notes.txt", "data", "PEC_STORE", "config.yaml"}) EXPECT_FALSE(formats::is_checkpoint_entry(n)) << n;
}

}  // namespace detect_test
