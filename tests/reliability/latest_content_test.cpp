// A `latest` pointer symlinked to another file (issue 32, WEAK "messages"): the tools printed the
// file's content (600 bytes, escaped but not cut) in the error. They must name the pointer and what is
// wrong, never the content. Run as job scripts do: relative paths, from the checkpoint's parent folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace latest_content_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_command;

namespace {

// A copy of the fixture `gpt` under a scratch folder whose `latest` is a symlink to `secret`.
fs::path checkpoint_with_secret(const std::string& name, const std::string& secret) {
  const fs::path d = ucpkit::testing::scratch_dir("latest_content_" + name);
  fs::copy(kFx + "/gpt", d / "gpt", fs::copy_options::recursive);
  std::ofstream(d / "secret.txt", std::ios::binary) << secret;
  fs::remove(d / "gpt" / "latest");
  fs::create_symlink(d / "secret.txt", d / "gpt" / "latest");
  return d;
}

void expect_no_content(const fs::path& d, const std::string& marker, const std::string& expect) {
  const std::string cd = "cd " + quote(d.string()) + " && ";
  const std::string commands[] = {
      kBin + "/ucp-info gpt",
      kBin + "/ucp-union -q --no-sync --input gpt --output u",
      kBin + "/ucp-extract -q --no-sync --input gpt --output w",
      kBin + "/ucp-load -q --no-sync --input gpt --output l --dp 1",
  };
  for (const auto& c : commands) {
    std::string log;
    EXPECT_EQ(run_command(cd + c, &log), 1) << c << "\n" << log;
    EXPECT_EQ(log.find(marker), std::string::npos) << "file content echoed by " << c << ": " << log;
    EXPECT_NE(log.find("latest"), std::string::npos) << "the pointer is not named: " << log;
    EXPECT_NE(log.find(expect), std::string::npos) << c << ": " << log;
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1) << "not one line: " << log;
    EXPECT_LT(log.size(), 400u) << log;
  }
}

}  // namespace

// 600 bytes over several lines: not a tag at all.
TEST(LatestContent, SymlinkToMultiLineSecretIsNotEchoed) {
  std::string secret;
  while (secret.size() < 600) secret += "password=SECRETVALUE-hunter2\n";
  const fs::path d = checkpoint_with_secret("multiline", secret);
  expect_no_content(d, "SECRETVALUE", "latest: not a step tag (" + std::to_string(secret.size()) + " bytes");
  fs::remove_all(d);
}

// One short line that could pass for a tag: the pointer names a folder that does not exist, and the
// text is still not printed.
TEST(LatestContent, SymlinkToOneLineSecretIsNotEchoed) {
  const fs::path d = checkpoint_with_secret("oneline", "SECRETTOKEN-0123456789abcdef\n");
  expect_no_content(d, "SECRETTOKEN", "not a folder");
  fs::remove_all(d);
}

// A real global_stepN tag naming a missing folder is still named (it is not secret and it helps).
TEST(LatestContent, MissingStepFolderIsNamed) {
  const fs::path d = ucpkit::testing::scratch_dir("latest_content_missing");
  fs::copy(kFx + "/gpt", d / "gpt", fs::copy_options::recursive);
  std::ofstream(d / "gpt" / "latest", std::ios::binary | std::ios::trunc) << "global_step77";
  std::string log;
  EXPECT_EQ(run_command("cd " + quote(d.string()) + " && " + kBin + "/ucp-info gpt", &log), 1) << log;
  EXPECT_NE(log.find("names global_step77, which is not a folder"), std::string::npos) << log;
  fs::remove_all(d);
}

}  // namespace latest_content_test
