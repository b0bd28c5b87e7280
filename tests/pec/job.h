// A job folder for tests that run the real pec tools as a job script runs them: the `ds` fixture's
// steps copied in as ck<step>/, the tools run from the folder with relative paths (issue 32 tests).
// UCPKIT_TEST_BIN runs the tests against other tools (a base build's, to see a test fail before).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>

#include "support/process.h"

namespace ucpkit::testing {

inline const std::string kPecFixtures = UCPKIT_FIXTURES_DIR;

inline std::string pec_tools_dir() {
  const char* b = std::getenv("UCPKIT_TEST_BIN");
  return b ? b : UCPKIT_BIN_DIR;
}

struct PecJob {
  std::string dir;
  PecJob(const std::string& name, std::initializer_list<int> steps) : dir(scratch_dir(name)) {
    for (int s : steps)
      std::filesystem::copy(kPecFixtures + "/ds/step" + std::to_string(s), dir + "/ck" + std::to_string(s),
                            std::filesystem::copy_options::recursive);
    std::filesystem::create_directories(dir + "/io");
  }
  SplitResult run(const std::string& cmd) const { return run_split_in(dir, cmd, dir + "/io"); }
};

}  // namespace ucpkit::testing
