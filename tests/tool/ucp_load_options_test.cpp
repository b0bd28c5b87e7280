// tool::UcpLoadOptions::check: ucp-load's rules between options, with the messages the tool prints
// (exit 2), and the library options it fills (docs/commands.md, docs/ucp-load.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "io/dtype.h"
#include "refusal.h"
#include "tool/ucp_load.h"

namespace ucp_load_options_test {

namespace fs = std::filesystem;
using ucpkit::testing::refusal;
using ucpkit::tool::UcpLoadOptions;

namespace {

// A command line's options: --input in, --output out, the whole target layout given.
UcpLoadOptions given_layout(const std::string& input = "in") {
  UcpLoadOptions o;
  o.load.input = input;
  o.load.output = "out";
  o.given = {true, true, true, true, false, false};
  return o;
}

// A folder that formats::detect calls universal (it holds manifest.json), removed at
// the end of the test.
struct UniversalFolder {
  std::string dir = (fs::temp_directory_path() / ("ucpkit-load-options-" + std::to_string(::getpid()))).string();
  UniversalFolder() {
    fs::create_directories(dir);
    std::ofstream(fs::path(dir) / "manifest.json") << "{}";
  }
  ~UniversalFolder() { fs::remove_all(dir); }
};

}  // namespace

TEST(UcpLoadOptions, SizesMustBePositiveNamedAsTyped) {
  auto o = given_layout();
  o.shard_size = 0;
  EXPECT_EQ(refusal(o), "--shard-size must be positive");
  o.args = {"--shard-size-gb", "0"};
  EXPECT_EQ(refusal(o), "--shard-size-gb must be positive");
  o = given_layout();
  o.batch = 0;
  EXPECT_EQ(refusal(o), "--batch must be positive");
  o.args = {"--batch-mb", "0"};
  EXPECT_EQ(refusal(o), "--batch-mb must be positive");
}

TEST(UcpLoadOptions, DeviceCudaNeedsTheWholeLayout) {
  auto o = given_layout();
  o.device = "cuda";
  o.given.zero_stage = false;
  EXPECT_EQ(refusal(o), "--device cuda needs --tp, --pp, --dp and --zero-stage (see --help)");
  o.given.zero_stage = true;
  o.given.tp = false;
  EXPECT_EQ(refusal(o), "--device cuda needs --tp, --pp, --dp and --zero-stage (see --help)");
  // ... and reads a universal checkpoint, into the deepspeed layout only
  o = given_layout("no-such-folder");
  o.device = "cuda";
  EXPECT_EQ(refusal(o), "--device cuda reads a universal checkpoint; no-such-folder has no manifest.json");
  o.format = "safetensors";
  EXPECT_EQ(refusal(o), "--device cuda loads the deepspeed layout only");
  const UniversalFolder universal;
  o = given_layout(universal.dir);
  o.device = "cuda";
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(UcpLoadOptions, OutputIsRequiredButForPlanAndDeviceCuda) {
  auto o = given_layout();
  o.load.output.clear();
  EXPECT_EQ(refusal(o), "--output is required (see --help)");
  o.dry_run = true;  // --dry-run says where it would write: it needs --output too
  EXPECT_EQ(refusal(o), "--output is required (see --help)");
  o.plan = true;
  EXPECT_EQ(refusal(o), "accepted");
  const UniversalFolder universal;
  o = given_layout(universal.dir);
  o.load.output.clear();
  o.device = "cuda";
  EXPECT_EQ(refusal(o), "accepted");
}

// --tp, --pp, --dp, --zero-stage and --ep mean nothing to a DCP or safetensors output: refused, not
// ignored (issue 45), naming the option; --world-size too for safetensors.
TEST(UcpLoadOptions, LayoutOptionsAFormatDoesNotUseAreRefused) {
  auto o = given_layout();
  o.format = "dcp";
  EXPECT_EQ(refusal(o).rfind("--tp does not apply to --format dcp", 0), 0u) << refusal(o);
  o.given = {false, false, false, false, true, false};
  EXPECT_EQ(refusal(o).rfind("--ep does not apply to --format dcp", 0), 0u) << refusal(o);
  o.given.ep = false;
  o.world_size = 8;
  EXPECT_EQ(refusal(o), "accepted");
  o.format = "safetensors";
  EXPECT_EQ(refusal(o), "--world-size does not apply to --format safetensors (one set of unsharded weights)");
}

TEST(UcpLoadOptions, ExchangeOnIsForTheDeepSpeedFormat) {
  auto o = given_layout();
  o.exchange = "on";
  o.format = "safetensors";
  EXPECT_EQ(refusal(o), "--exchange on applies to --format deepspeed");
  o.format = "deepspeed";
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(UcpLoadOptions, VerifyAgainstIsForANativeInputOfAConversion) {
  const UniversalFolder folder;
  const std::string& universal = folder.dir;
  auto o = given_layout(universal);
  o.load.verify_against = "reference";
  EXPECT_EQ(refusal(o), "--verify-against applies to a native checkpoint input; " + universal +
                            " is a universal checkpoint (its own checksums are checked)");
  o.plan = true;  // the plan reads no tensor: nothing to verify, nothing refused
  EXPECT_EQ(refusal(o), "accepted");
  o = given_layout("native-checkpoint");
  o.load.verify_against = "reference";
  EXPECT_EQ(refusal(o), "accepted");
}

TEST(UcpLoadOptions, FillsTheLibraryOptions) {
  auto o = given_layout();
  o.tp = 2, o.pp = 3, o.dp = 4, o.zero_stage = 2, o.ep = 5;
  o.dtype = "fp16";
  o.optimizer = "bf16";
  o.exchange = "off";
  o.format = "torch_dist";  // a format that takes the layout (dcp and safetensors refuse it)
  o.world_size = 24;
  o.shard_size = 16 << 10;
  o.batch = 1 << 20;
  o.verify = false;
  o.check();
  const auto& l = o.load;
  EXPECT_EQ(l.target.tp, 2);
  EXPECT_EQ(l.target.pp, 3);
  EXPECT_EQ(l.target.dp, 4);
  EXPECT_EQ(l.target.zero_stage, 2);
  EXPECT_EQ(l.target.ep, 5);
  EXPECT_EQ(l.target.dtype, ucpkit::DType::Float16);
  EXPECT_EQ(l.optimizer, ucpkit::reshard::OptimizerKind::Bf16);
  EXPECT_EQ(l.exchange, ucpkit::reshard::ExchangeMode::Files);
  EXPECT_EQ(l.format, ucpkit::reshard::OutputFormat::TorchDist);
  EXPECT_EQ(l.given.world_size, 24);
  EXPECT_TRUE(l.given.tp && l.given.zero_stage);
  EXPECT_FALSE(l.given.ep || l.given.dtype);
  EXPECT_EQ(l.shard_bytes, 16u << 10);
  EXPECT_EQ(l.batch_bytes, 1u << 20);
  EXPECT_FALSE(l.verify);
}

}  // namespace ucp_load_options_test
