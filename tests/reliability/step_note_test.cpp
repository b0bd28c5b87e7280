// pec-save's "step N inferred from <path>" note printed the path's bytes as they are (issue 32, WEAK
// "messages": raw control bytes in messages): a folder name with an escape sequence reached the
// terminal. The path is now escaped (\xNN) and cut. Run as job scripts do: relative paths.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace step_note_test {

namespace fs = std::filesystem;
using ucpkit::testing::quote;
using ucpkit::testing::run_split_in;

TEST(StepNote, ControlBytesInTheFolderNameAreEscaped) {
  const fs::path d = ucpkit::testing::scratch_dir("step_note");
  const std::string odd = "ck\x1b[1m\x07pt";  // ESC [ 1 m, BEL
  fs::create_directories(d / odd);
  fs::copy(kFx + "/moe", d / odd / "moe", fs::copy_options::recursive);
  const auto io = ucpkit::testing::scratch_dir("step_note_io");
  const auto r = run_split_in(d.string(),
                              kBin + "/pec-save --checkpoint " + quote(odd + "/moe") + " --store st --policy sequential --k 2",
                              io);
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  ASSERT_NE(all.find("inferred from"), std::string::npos) << all;
  EXPECT_EQ(all.find('\x1b'), std::string::npos) << "raw ESC in: " << all;
  EXPECT_EQ(all.find('\x07'), std::string::npos) << "raw BEL in: " << all;
  EXPECT_NE(all.find("ck\\x1b[1m\\x07pt"), std::string::npos) << "the folder is not named, escaped: " << all;
  fs::remove_all(d);
}

}  // namespace step_note_test
