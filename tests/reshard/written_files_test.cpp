// ucp-load writes exactly the files of the target layout's one list (formats/deepspeed/file_names.h
// expected_files) and reports that many (`files_written`, --json), for every native-MoE DeepSpeed
// version line: 0.19.5 writes no expp_rank_* files under ZeRO (engine.py v0.19.5:5066-5087), the older
// lines one per EP rank. The files on disk are the independent truth; the list comes from the plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/version_line.h"
#include "reshard/model_info.h"
#include "reshard/ucp_info.h"
#include "support/paths.h"
#include "support/process.h"

namespace written_files_test {

namespace fs = std::filesystem;
namespace support = ucpkit::testing;
namespace reshard = ucpkit::reshard;
namespace formats = ucpkit::formats;

namespace {

std::vector<std::string> pt_files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".pt") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class WrittenFiles : public ::testing::TestWithParam<const char*> {};

TEST_P(WrittenFiles, NativeMoeTargetWritesTheExpectedListAndReportsItsLength) {
  const std::string line = GetParam();
  const fs::path src = fs::path(kFx) / "moe_lines" / line;
  const fs::path dir = support::scratch_dir("written_files_" + line);
  std::string out;
  ASSERT_EQ(support::run_command(kBin + "/ucp-union -q --input " + src.string() + " --output " + (dir / "u").string(), &out),
            0) << out;
  fs::create_directories(dir / "io");
  const auto r = support::run_split_in(dir.string(),
                                       kBin + "/ucp-load --json --input u --output t --tp 1 --pp 1 --dp 4 --zero-stage 1 "
                                              "--ep 4 --dtype bf16 --optimizer zero --vocab-multiple 8",
                                       (dir / "io").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto summary = nlohmann::json::parse(r.out);

  const auto model = reshard::read_model_info((dir / "u").string());
  reshard::TargetLayout target;
  target.dp = 4;
  target.ep = 4;
  const auto plan = reshard::ucp_info(model, target);
  auto want = formats::deepspeed::expected_files(plan.files(model.native_moe), &formats::deepspeed::moe_version_line(line));
  std::sort(want.begin(), want.end());

  const auto written = pt_files_in(dir / "t" / model.tag);
  EXPECT_EQ(written, want);
  EXPECT_EQ(summary.at("files_written").template get<size_t>(), written.size());
  const bool expp = std::any_of(written.begin(), written.end(), [](const std::string& n) { return n.rfind("expp_rank_", 0) == 0; });
  EXPECT_EQ(expp, line != "0.19.5");
}

INSTANTIATE_TEST_SUITE_P(Lines, WrittenFiles, ::testing::Values("0.14", "0.17.1", "0.19.2", "0.19.3", "0.19.5"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

}  // namespace

}  // namespace written_files_test
