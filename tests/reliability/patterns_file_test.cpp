// Issue 32 (WEAK, messages): errors from a --patterns file named no file ("bad pattern 'a(b': ..."),
// printed nlohmann's text alone ("[json.exception.type_error.302] ..."), echoed a 3,000-character
// pattern whole, and a sub-param count of 1e15 ended in "std::bad_alloc". Now one line naming the file,
// the pattern or value escaped and cut at 80 characters, numbers bounded. ucp-union run as a job script
// runs it: from the job's folder, with relative paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace patterns_file_test {

namespace fs = std::filesystem;
using namespace ucpkit::testing;

TEST(PatternsFile, ErrorsNameTheFileAndShowLittle) {
  const std::string dir = scratch_dir("patterns_file_errors");
  fs::create_directories(dir + "/io");
  const std::string long_pattern(3000, 'x');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"parameter_with_row_parallelism_patterns": ["a(b"]})", "bad pattern 'a(b'"},
      {R"({"parameter_with_row_parallelism_patterns": ["\u001b[31mred("]})", "bad pattern '\\x1b[31mred('"},
      {R"({"parameter_with_row_parallelism_patterns": [")" + long_pattern + R"(("]})", "bad pattern 'xxxx"},
      {R"({"parameter_with_sub_params": [{"patterns": [3], "shape": [1, 2], "partition_dim": 0}]})", "malformed patterns"},
      {R"({"parameter_with_sub_params": [{"patterns": ["x"], "shape": [1e15, 2], "partition_dim": 0}]})", "sub-param count 1e+15"},
      {R"({"original_vocab_size": 1e300})", "original_vocab_size 1e+300"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string file = "p" + std::to_string(i) + ".json";
    std::ofstream(dir + "/" + file) << cases[i].first;
    const SplitResult r = run_split_in(dir, kBin + "/ucp-union -q --input " + kFx + "/gpt --output u" + std::to_string(i) +
                                                " --patterns " + file, dir + "/io");
    EXPECT_EQ(r.rc, 1) << file << ": " << r.err;
    EXPECT_EQ(r.err.rfind("ucp-union: error: " + file + ": ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(cases[i].second), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_LT(r.err.size(), 300u) << r.err;
    EXPECT_FALSE(fs::exists(dir + "/u" + std::to_string(i))) << file;
  }
}

}  // namespace patterns_file_test
