// Issue 32 (WEAK, messages): an option value with control bytes was echoed raw into the usage error
// (`--step $'x\e[31m'` put an escape sequence on the user's terminal; a newline split the line). Now
// the line shows them as \xNN and is cut. Tools run as a job script runs them, from another folder.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "support/process.h"

namespace option_messages_test {

using namespace ucpkit::testing;

TEST(OptionMessages, ControlBytesInAnOptionValueAreEscaped) {
  const std::string dir = scratch_dir("option_messages");
  const std::string bin = UCPKIT_BIN_DIR;
  const std::string value = "'x\x1b[31m\nsecond line" + std::string(500, 'y') + "'";
  for (const std::string cmd : {bin + "/pec-restore --store st --output o --step " + value,
                                bin + "/pec-save --checkpoint c --store st --k 1 --policy " + value,
                                bin + "/ucp-union --input i --output o --threads " + value}) {
    const SplitResult r = run_split_in(dir, cmd, dir);
    EXPECT_EQ(r.rc, 2) << r.err;
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("\\x1b[31m"), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_LT(r.err.size(), 400u) << r.err;
  }
}

}  // namespace option_messages_test
