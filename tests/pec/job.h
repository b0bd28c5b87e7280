// A job folder for tests that run the real pec tools as a job script runs them: the `ds` fixture's
// steps copied in as ck<step>/, the tools run from the folder with relative paths (issue 32 tests).
#pragma once
#include <filesystem>
#include <initializer_list>
#include <string>

#include "support/paths.h"
#include "support/process.h"

namespace ucpkit::testing {

struct PecJob {
  std::string dir;
  PecJob(const std::string& name, std::initializer_list<int> steps) : dir(scratch_dir(name)) {
    for (int s : steps)
      std::filesystem::copy(kFx + "/ds/step" + std::to_string(s), dir + "/ck" + std::to_string(s),
                            std::filesystem::copy_options::recursive);
    std::filesystem::create_directories(dir + "/io");
  }
  SplitResult run(const std::string& cmd) const { return run_split_in(dir, cmd, dir + "/io"); }
};

}  // namespace ucpkit::testing
