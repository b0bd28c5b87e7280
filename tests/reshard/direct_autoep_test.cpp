// ucp-load's direct mode on DeepSpeed AutoEP sources (issue 18): ZeRO-1/2 AutoEP and ZeRO-3 AutoEP
// (expert sub-groups partitioned over the expert-DP group) read straight from the native checkpoint
// give the same bytes as the two-step path (ucp-union, then ucp-load), in one process and under
// mpirun -np 2, and --plan's source -> target copies hold what they say (load/direct_check.h).
// Sources: tests/generator/dsgen/autoep.py (DeepSpeed v0.19.5's save code), made once per run by
// tests/reshard/autoep_sources.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>
#include <ostream>
#include <string>

#include "reshard/direct_check.h"
#include "support/paths.h"
#include "support/process.h"

namespace direct_autoep_test {

namespace fs = std::filesystem;
using ucpkit::testing::run_command;

namespace {

// Every source, generated once (one Python start).
const fs::path& sources() {
  static const fs::path dir = ucpkit::testing::scratch_dir("direct_autoep_sources");
  static std::once_flag once;
  std::call_once(once, [] {
    std::string out;
    const int rc = run_command(kPy + " " + kSrc + "/tests/reshard/autoep_sources.py " + dir.string() +
                                   " dp4_ep2_zero1_bf16 dp6_ep2_zero2_fp16_data_before_expert dp4_ep2_zero3_bf16"
                                   " dp6_ep2_zero3_fp16_data_before_expert",
                               &out);
    if (rc != 0) ADD_FAILURE() << out;
  });
  return dir;
}

struct Case {
  const char* source;
  const char* args;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.source; }  // ctest names without bytes

class LoadDirectAutoEp : public ::testing::TestWithParam<Case> {};

TEST_P(LoadDirectAutoEp, SameBytesAsTwoStep) {
  const Case c = GetParam();
  ucpkit::testing::expect_direct_equals_two_step((sources() / c.source).string(), std::string(" ") + c.args,
                                                 std::string("direct_autoep_") + c.source);
}

INSTANTIATE_TEST_SUITE_P(
    Sources, LoadDirectAutoEp,
    ::testing::Values(
        // ZeRO-1 AutoEP, EP 2 -> 4
        Case{"dp4_ep2_zero1_bf16", "--tp 1 --pp 1 --dp 4 --zero-stage 1 --dtype bf16 --ep 4"},
        // ZeRO-2, fp16, expert-DP ranks before EP ranks, to its own layout
        Case{"dp6_ep2_zero2_fp16_data_before_expert", "--tp 1 --pp 1 --dp 6 --ep 2 --zero-stage 2 --dtype fp16"},
        // ZeRO-3 AutoEP (zero3_partitioned expert sub-groups) to ZeRO-1 at EP 4
        Case{"dp4_ep2_zero3_bf16", "--tp 1 --pp 1 --dp 4 --zero-stage 1 --dtype bf16 --ep 4"},
        // ZeRO-3 AutoEP with padded expert-DP partitions, expert-DP ranks first, to ZeRO-2 DP 2 EP 1
        Case{"dp6_ep2_zero3_fp16_data_before_expert", "--tp 1 --pp 1 --dp 2 --ep 1 --zero-stage 2 --dtype fp16"}),
    [](const auto& info) { return std::string(info.param.source); });

}  // namespace

}  // namespace direct_autoep_test
