// core/confine: names read from files stay inside their folder; outputs never overlap inputs
// (aliases through symbolic links and "..", trailing slashes included).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/confine.h"
#include "core/error.h"
#include "support/process.h"

namespace confine_test {

using namespace ucpkit;
namespace fs = std::filesystem;

TEST(Confine, NamesInsideTheFolderOnly) {
  for (const char* ok : {"a", "a/b.pt", "zero/layer.0/fp32.pt", "..a", "a..", ".hidden"})
    EXPECT_TRUE(is_confined_name(ok)) << ok;
  for (std::string bad : {std::string(""), std::string("/etc/hostname"), std::string(".."), std::string("../x"),
                          std::string("a/../../x"), std::string("a//b"), std::string("./a"), std::string("a/."),
                          std::string("a/"), std::string("a\0b", 3)})
    EXPECT_FALSE(is_confined_name(bad)) << escaped_brief(bad);
}

TEST(Confine, ConfinedPathJoinsOrThrowsNamingTheSource) {
  EXPECT_EQ(confined_path("/data/ckpt", "zero/a.pt", "manifest.json", "file"), fs::path("/data/ckpt/zero/a.pt"));
  try {
    confined_path("/data/ckpt", "../../etc/passwd\n", "manifest.json", "file");
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("manifest.json: ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("\\x0a"), std::string::npos) << msg;
  }
}

TEST(Confine, PrintableNameEscapesAndCuts) {
  EXPECT_EQ(escaped_brief("a\\b\x7f"), "a\\x5cb\\x7f");
  std::string cut = escaped_brief(std::string(100, 'n'));
  EXPECT_EQ(cut, std::string(80, 'n') + "...");
}

TEST(Confine, PathWithinSeesThroughLinksDotsAndSlashes) {
  const fs::path root = ucpkit::testing::scratch_dir("confine_within");
  fs::create_directories(root / "in" / "sub");
  fs::create_directory_symlink(root / "in", root / "alias");
  EXPECT_TRUE(path_within(root / "in", root / "in"));
  EXPECT_TRUE(path_within(root / "in" / "sub", root / "in"));
  EXPECT_TRUE(path_within(root / "in/", root / "in"));
  EXPECT_TRUE(path_within(root / "alias" / "sub", root / "in"));
  EXPECT_TRUE(path_within(root / "in" / "sub" / ".." / "new", root / "in"));
  EXPECT_TRUE(path_within(root / "in" / "not-yet" / "deeper", root / "in"));
  EXPECT_FALSE(path_within(root / "in", root / "in" / "sub"));
  EXPECT_FALSE(path_within(root / "inx", root / "in"));
  EXPECT_FALSE(path_within(root / "in" / ".." / "out", root / "in"));
}

TEST(Confine, OutputOverInputIsAUsageErrorSayingHow) {
  const fs::path root = ucpkit::testing::scratch_dir("confine_over");
  fs::create_directories(root / "src" / "inner");
  auto message = [&](const fs::path& out) -> std::string {
    try {
      refuse_output_over_input(out, "--output", root / "src", "--input");
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(root / "src").find(" is --input"), std::string::npos);
  EXPECT_NE(message(root / "src" / "inner").find(" lies inside --input"), std::string::npos);
  EXPECT_NE(message(root).find(" holds --input"), std::string::npos);
  EXPECT_EQ(message(root / "elsewhere"), "");
}

}  // namespace confine_test
