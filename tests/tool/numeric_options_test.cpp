// Every numeric option of the checkpoint tools is finite and in range (issue 32, WEAK "nonsense option
// values": NaN, infinite, negative, zero where zero means nothing, absurdly large): exit 2 with one line
// naming the option as typed, nothing written. At 6116fc0 e.g. `ucp-load --vocab-multiple 99999999999`
// planned a 39 GB vocabulary, `pec-restore --step -5` restored the latest step, `pec-save --bandwidth nan`
// stored a budget of 2^63, `--keep 0` silently meant 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "support/process.h"

namespace numeric_options_test {

namespace fs = std::filesystem;

namespace {

struct Case {
  std::string tool, base, option;
  std::vector<std::string> bad;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"ucp-load", "--input in --output out", "--tp", {"0", "-1", "nan", "2.5", "1e9"}},
      {"ucp-load", "--input in --output out", "--pp", {"0", "inf"}},
      {"ucp-load", "--input in --output out", "--dp", {"0", "-2", "nan"}},
      {"ucp-load", "--input in --output out", "--ep", {"0", "nan"}},
      {"ucp-load", "--input in --output out", "--world-size", {"0", "1e30"}},
      {"ucp-load", "--input in --output out --dp 2", "--vocab-multiple", {"0", "-3", "99999999999", "nan"}},
      {"ucp-load", "--input in --output out --dp 2", "--sub-group-size", {"0", "1e30", "nan"}},
      {"ucp-load", "--input in --output out --dp 2", "--pp-rank", {"-1", "nan"}},
      {"ucp-load", "--input in --output out --dp 2", "--threads", {"-1", "100000", "nan"}},
      {"ucp-load", "--input in --output out --dp 2", "--batch-mb", {"nan", "-1", "1e15"}},
      {"ucp-load", "--input in --output out --dp 2", "--batch", {"2P"}},
      {"ucp-union", "--input in --output out", "--tolerance", {"-1", "nan", "inf"}},
      {"ucp-extract", "--input in --output out", "--threads", {"-1", "nan"}},
      {"ucp-diff", "a b", "--rtol", {"-1", "nan", "inf"}},
      {"ucp-diff", "a b", "--atol", {"nan"}},
      {"ucp-diff", "a b", "--max-listed", {"-1", "nan"}},
      {"pec-save", "--store st --policy sequential", "--step", {"-5", "nan", "1e300"}},
      {"pec-save", "--store st --policy sequential", "--k", {"-1", "nan"}},
      {"pec-save", "--store st --policy budget", "--bandwidth", {"nan", "0", "-5", "inf"}},
      {"pec-save", "--store st --policy budget", "--iteration-seconds", {"nan", "0", "-1"}},
      {"pec-save", "--store st --policy sequential", "--keep", {"0", "-1"}},
      {"pec-save", "--store st --policy sequential", "--keep-fast", {"0"}},
      {"pec-save", "--store st --policy sequential", "--zstd-level", {"-1", "23", "nan"}},
      {"pec-save", "--store st --policy sequential", "--poll-seconds", {"0", "nan", "-1"}},
      {"pec-save", "--store st --policy sequential", "--keep-snapshots", {"-1"}},
      {"pec-save", "--store st --policy sequential", "--ep", {"0"}},
      {"pec-save", "--store st --policy sequential", "--chunk", {"9P"}},
      {"pec-restore", "--store st --output out", "--step", {"-5", "nan"}},
      {"pec-restore", "--store st --output out", "--plt-threshold", {"nan", "-0.1", "1.5"}},
      {"pec-restore", "--store st --output out", "--capacity-factor", {"nan", "0.5", "inf"}},
      {"pec-restore", "--store st --output out", "--memory-mb", {"nan", "1e12"}},
  };
  return c;
}

}  // namespace

TEST(NumericOptions, NonsenseValuesAreUsageErrorsNamingTheOption) {
  const std::string dir = ucpkit::testing::scratch_dir("numeric_options");
  for (const Case& c : cases()) {
    for (const std::string& v : c.bad) {
      const std::string cmd = std::string(UCPKIT_BIN_DIR) + "/" + c.tool + " " + c.base + " " + c.option + " " + v;
      const auto r = ucpkit::testing::run_split_in(dir, cmd, dir + "/../");
      SCOPED_TRACE(cmd + "\nstderr: " + r.err);
      EXPECT_EQ(r.rc, 2);
      EXPECT_NE(r.err.find(c.option), std::string::npos) << "the message does not name " << c.option;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line";
      EXPECT_TRUE(fs::is_empty(dir)) << "something was written";
    }
  }
}

TEST(NumericOptions, TheEdgesOfEachRangeAreAccepted) {
  // The same options at their bounds pass the parse: the run goes on and fails later for the missing
  // input (exit 1), never exit 2 from the range check.
  const std::string dir = ucpkit::testing::scratch_dir("numeric_edges");
  for (const std::string& args :
       {std::string("ucp-load --input in --output out --dp 1 --vocab-multiple 65536 --threads 0"),
        std::string("ucp-load --input in --output out --dp 1048576 --tp 1 --pp 1"),
        std::string("ucp-union --input in --output out --tolerance 0"),
        std::string("pec-restore --store st --output out --step 0 --plt-threshold 1 --capacity-factor 1"),
        std::string("pec-save --store st --policy sequential --k 1 --input in --zstd-level 22 --keep 1 --keep-fast 1")}) {
    const auto r = ucpkit::testing::run_split_in(dir, std::string(UCPKIT_BIN_DIR) + "/" + args, dir + "/../");
    EXPECT_EQ(r.rc, 1) << args << "\n" << r.err;
  }
}

}  // namespace numeric_options_test
