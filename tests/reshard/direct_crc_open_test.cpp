// ucp-load's direct mode computes the source files' zip CRC-32 on the bytes its copy reads, and says
// so per open (issue 46: TorchLoadOptions::crc_at_open, not a process-wide switch turned off for the
// run and back on): a direct run opens no file with the check, and the tools' --verify setting is
// never touched, so a universal-folder run in the same process still checks each file it opens.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "io/torch/verify.h"
#include "support/paths.h"
#include "support/process.h"
#include "tool/ucp_load.h"

namespace direct_crc_open_test {

namespace fs = std::filesystem;
using namespace ucpkit;

namespace {

// ucp-load --dp 4 (the rest the source's), in this process.
tool::Result load(const std::string& input, const std::string& output) {
  tool::UcpLoadOptions o;
  o.load.input = input;
  o.load.output = output;
  o.dp = 4;
  o.given = {false, false, true, false, false, false};
  o.check();
  return tool::run_ucp_load(o);
}

}  // namespace

TEST(DirectCrcAtOpen, ADirectRunChecksOnTheCopyNotAtOpen) {
  const fs::path d = ucpkit::testing::scratch_dir("direct_crc_open");
  ASSERT_TRUE(verify_files_crc());
  const size_t before = files_crc_checked_at_open();
  // Dense ZeRO-1/2, a pipeline with layer files, native MoE with expert files, ZeRO-3, BF16_Optimizer.
  for (const char* name : {"gpt_tp1dp2_to_tp2dp3", "gpt_pp2_to_tp2pp4dp2", "dsmoe_ep4dp4_to_ep2dp6",
                           "gpt_zero3_tp1dp2_subgroups_to_tp2dp3", "llama_tp2_to_tp1dp5_bf16opt"}) {
    SCOPED_TRACE(name);
    const tool::Result direct = load((fs::path(kFx) / name / "src").string(), (d / name).string());
    EXPECT_EQ(direct.exit_code, 0);
    EXPECT_EQ(files_crc_checked_at_open(), before) << "a direct run opened a source file with the CRC check";
    EXPECT_TRUE(verify_files_crc());
  }
  const std::string src = (fs::path(kFx) / "gpt_tp1dp2_to_tp2dp3" / "src").string();
  // The same source as a universal folder: each file read is checked when it is opened.
  std::string out;
  ASSERT_EQ(ucpkit::testing::run_command(kBin + "/ucp-union -q --input " + src + " --output " + (d / "u").string(), &out), 0)
      << out;
  const tool::Result two_step = load((d / "u").string(), (d / "two").string());
  EXPECT_EQ(two_step.exit_code, 0);
  EXPECT_GT(files_crc_checked_at_open(), before);
  // Both wrote the same bytes.
  out.clear();
  EXPECT_EQ(ucpkit::testing::run_command("diff -r " + (d / "gpt_tp1dp2_to_tp2dp3").string() + " " + (d / "two").string(), &out), 0) << out;
}

}  // namespace direct_crc_open_test
