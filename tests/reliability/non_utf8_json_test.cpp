// Paths that are not UTF-8 with --json (issue 32, WEAK "messages"): after committing, ucp-info,
// pec-save and pec-restore exited 1 with `[json.exception.type_error.316]` and no file named, since
// the JSON envelope's dump() threw on the path. The envelope is now written with invalid bytes as
// U+FFFD: valid JSON, and the exit code is the run's. Run as job scripts do: relative paths.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "support/paths.h"
#include "support/process.h"

namespace non_utf8_json_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_split_in;

namespace {
const std::string kOdd = std::string("ck\xff") + "pt";  // a folder name with a byte 0xff

// Runs `command` in `cwd`; it must exit 0 with parseable JSON on stdout.
void expect_json(const fs::path& cwd, const std::string& command) {
  const fs::path io = ucpkit::testing::scratch_dir("non_utf8_json_io");
  const auto r = run_split_in(cwd.string(), command, io.string());
  EXPECT_EQ(r.rc, 0) << command << "\n" << r.out << r.err;
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
  EXPECT_TRUE(nlohmann::json::accept(r.out)) << "not JSON: " << r.out;
}
}  // namespace

TEST(NonUtf8Json, InfoOfACheckpointUnderA0xffFolder) {
  const fs::path d = ucpkit::testing::scratch_dir("non_utf8_json_info");
  fs::create_directories(d / kOdd);
  fs::copy(kFx + "/gpt", d / kOdd / "gpt", fs::copy_options::recursive);
  expect_json(d, kBin + "/ucp-info --json " + quote(kOdd + "/gpt"));
  fs::remove_all(d);
}

TEST(NonUtf8Json, PecSaveAndRestoreUnderA0xffFolder) {
  const fs::path d = ucpkit::testing::scratch_dir("non_utf8_json_pec");
  fs::create_directories(d / kOdd);
  fs::copy(kFx + "/moe", d / kOdd / "moe", fs::copy_options::recursive);
  expect_json(d, kBin + "/pec-save -q --json --checkpoint " + quote(kOdd + "/moe") + " --store " + quote(kOdd + "/store") +
                      " --policy sequential --k 2");
  expect_json(d, kBin + "/pec-restore -q --json --store " + quote(kOdd + "/store") + " --output " + quote(kOdd + "/r"));
  EXPECT_TRUE(fs::exists(d / kOdd / "r"));
  fs::remove_all(d);
}

// ucp-union and ucp-extract record the source's paths in plan.json / manifest.json (JSON strings are
// UTF-8): a source under a 0xff folder ended in `[json.exception.type_error.316]` naming no file. Now
// one line naming the folder (escaped) and what to do, exit 1, nothing written; an output folder with
// such a name still works (its path is not recorded).
TEST(NonUtf8Json, UnionAndExtractNameANonUtf8InputFolder) {
  const fs::path d = ucpkit::testing::scratch_dir("non_utf8_json_union");
  fs::create_directories(d / kOdd);
  fs::copy(kFx + "/gpt", d / kOdd / "gpt", fs::copy_options::recursive);
  const fs::path io = ucpkit::testing::scratch_dir("non_utf8_json_union_io");
  for (const char* tool : {"ucp-union", "ucp-extract"}) {
    const auto r = run_split_in(d.string(), kBin + "/" + tool + " -q --input " + quote(kOdd + "/gpt") + " --output out", io.string());
    EXPECT_EQ(r.rc, 1) << tool << r.err;
    EXPECT_NE(r.err.find("ck\\xffpt/gpt: the --input path is not valid UTF-8"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(d / "out")) << tool;
  }
  const auto ok = run_split_in(d.string(), kBin + "/ucp-union -q --input " + quote(kFx + "/gpt") + " --output " + quote(kOdd + "/u"),
                               io.string());
  EXPECT_EQ(ok.rc, 0) << ok.err;
  EXPECT_TRUE(fs::exists(d / kOdd / "u" / "manifest.json"));
  fs::remove_all(d);
}

}  // namespace non_utf8_json_test
