// Native DeepSpeed MoE of every DeepSpeed version line (formats/deepspeed/version_line.h): the
// generator writes each line as DeepSpeed's save code does (tests/generator/dsgen/dsmoe.py); ucp-union
// must give the ground truth, ucp-load EP 2 -> 4 -> 2 must round-trip bit for bit, and what ucp-load
// writes must be laid out as the line (checked by tests/reshard/check_moe_line.py, which reads the files
// the way DeepSpeed's load_moe_state_dict and Megatron's load_state_dict do).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/paths.h"
#include "support/process.h"
#include "support/files.h"

namespace moe_lines_test {

namespace fs = std::filesystem;

using ucpkit::testing::file_bytes;

namespace {

const char* const kLines[] = {"0.14", "0.17.1", "0.19.2", "0.19.3", "0.19.5"};

int sh(const std::string& cmd, std::string* out = nullptr) { return ucpkit::testing::run_command(cmd, out); }

std::string ds_line_of(const fs::path& universal) {
  std::ifstream in(universal / "manifest.json");
  nlohmann::json j;
  in >> j;
  return j["source"].value("ds_line", std::string("<none>"));
}

// Every atomic file (zero/<param>/<state>.pt) of `a` is in `b` with the same bytes, and no more.
void expect_same_atomics(const fs::path& a, const fs::path& b) {
  size_t files = 0, in_b = 0;
  for (const auto& e : fs::recursive_directory_iterator(a / "zero")) {
    if (!e.is_regular_file() || e.path().filename() == "optimizer_state.pt") continue;
    const auto rel = fs::relative(e.path(), a);
    ASSERT_TRUE(fs::exists(b / rel)) << rel;
    EXPECT_TRUE(file_bytes(e.path()) == file_bytes(b / rel)) << rel << " differs";
    ++files;
  }
  for (const auto& e : fs::recursive_directory_iterator(b / "zero"))
    if (e.is_regular_file() && e.path().filename() != "optimizer_state.pt") ++in_b;
  EXPECT_EQ(files, in_b);
  EXPECT_GT(files, 100u);
}

std::string load_args(int dp, int ep) {
  return " --tp 1 --pp 1 --zero-stage 1 --dtype bf16 --optimizer zero --vocab-multiple 8 --dp " + std::to_string(dp) +
         " --ep " + std::to_string(ep);
}

class MoeLine : public ::testing::TestWithParam<int> {};

TEST_P(MoeLine, UnionMatchesTruthAndLoadRoundTripsInTheLinesLayout) {
  const std::string line = kLines[GetParam()];
  SCOPED_TRACE(line);
  const fs::path src = fs::path(kFx) / "moe_lines" / line;
  const fs::path dir = ucpkit::testing::scratch_dir("moe_line_" + line);
  const std::string meta = (src / "truth" / "meta.json").string();
  std::string out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + src.string() + " --output " + (dir / "u1").string(), &out), 0) << out;
  EXPECT_EQ(ds_line_of(dir / "u1"), line);
  EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/to_universal/check_universal.py " + (dir / "u1").string() + " " + src.string(), &out), 0)
      << out;
  // EP 2 -> 4 (DP 4), then EP 4 -> 2 (DP 2): each target is the source's line and unions back bit for bit.
  ASSERT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u1").string() + " --output " + (dir / "ep4").string() +
                   load_args(4, 4), &out), 0) << out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + (dir / "ep4").string() + " --output " + (dir / "u2").string(), &out), 0)
      << out;
  EXPECT_EQ(ds_line_of(dir / "u2"), line);
  expect_same_atomics(dir / "u1", dir / "u2");
  ASSERT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u2").string() + " --output " + (dir / "ep2").string() +
                   load_args(2, 2), &out), 0) << out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + (dir / "ep2").string() + " --output " + (dir / "u3").string(), &out), 0)
      << out;
  expect_same_atomics(dir / "u1", dir / "u3");
  // --ds-version: the next line (the oldest for the newest) from this line's universal checkpoint.
  const std::string other = kLines[(GetParam() + 1) % 5];
  ASSERT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u1").string() + " --output " + (dir / "other").string() +
                   load_args(4, 4) + " --ds-version " + other, &out), 0) << out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + (dir / "other").string() + " --output " + (dir / "u4").string(), &out), 0)
      << out;
  EXPECT_EQ(ds_line_of(dir / "u4"), other);
  expect_same_atomics(dir / "u1", dir / "u4");
  // The generator's files and the written folders, read as DeepSpeed and Megatron load them (one
  // Python start): the checker agrees with the generator, and ucp-load's output with both.
  EXPECT_EQ(sh(kPy + " " + kSrc + "/tests/reshard/check_moe_line.py " + src.string() + " " + line + " 2 " + meta + " " +
                   (dir / "ep4").string() + " " + line + " 4 " + meta +
                   " " + (dir / "ep2").string() + " " + line + " 2 " + meta + " " + (dir / "other").string() + " " +
                   other + " 4 " + meta,
               &out), 0) << out;
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Lines, MoeLine, ::testing::Range(0, 5));

TEST(MoeLineBadInput, UnknownDsVersionOrDenseSourceIsAUsageErrorAndWritesNothing) {
  const fs::path src = fs::path(kFx) / "moe_lines" / "0.14";
  const fs::path dir = ucpkit::testing::scratch_dir("moe_line_bad");
  std::string out;
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + src.string() + " --output " + (dir / "u").string(), &out), 0) << out;
  EXPECT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "u").string() + " --output " + (dir / "t").string() +
                   load_args(2, 2) + " --ds-version 0.12.6", &out), 2) << out;
  EXPECT_NE(out.find("unknown DeepSpeed version line '0.12.6'"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "t"));
  // A dense checkpoint has no DeepSpeed MoE version line to pick.
  const fs::path dense = fs::path(kFx) / "gpt_tp1dp2_to_tp2dp3" / "src";
  ASSERT_EQ(sh(kBin + "/ucp-union -q --input " + dense.string() + " --output " + (dir / "ud").string(), &out), 0) << out;
  EXPECT_EQ(sh(kBin + "/ucp-load -q --input " + (dir / "ud").string() + " --output " + (dir / "td").string() +
                   load_args(2, 1) + " --ds-version 0.14", &out), 2) << out;
  EXPECT_NE(out.find("--ds-version applies to native DeepSpeed MoE"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "td"));
  fs::remove_all(dir);
}

}  // namespace

}  // namespace moe_lines_test
