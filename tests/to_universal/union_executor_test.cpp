// The union registry's audit flag (to_universal/union_executor.h): which input formats' unions write --audit,
// and run_union's refusal of --audit for the others before anything is read or written.
#include "to_universal/union_executor.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "formats/detect.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "to_universal/convert.h"

namespace ucpkit::to_universal {
namespace union_executor_test {
namespace {

TEST(UnionExecutor, RegistrySaysWhichUnionsWriteAnAudit) {
  EXPECT_TRUE(has_union(std::string(formats::kHf)));
  EXPECT_TRUE(union_audits(std::string(formats::kHf)));  // the import's audit (docs/hf.md)
  for (const std::string_view f : {formats::kDeepSpeed, formats::kDcp, formats::kTorchDist}) {
    EXPECT_TRUE(has_union(std::string(f))) << f;
    EXPECT_FALSE(union_audits(std::string(f))) << f;
  }
  EXPECT_FALSE(union_audits("no-such-format"));
}

TEST(UnionExecutor, AuditOfAUnionWithoutOneIsRefusedBeforeAnythingIsWritten) {
  ucpkit::testing::TempDir tmp;
  ConvertOptions o;
  o.audit = (tmp.path() / "audit.json").string();
  const std::string out = (tmp.path() / "u").string();
  const std::string e = ucpkit::testing::error_of([&] { run_union(kFx + "/gpt_tp2_pp2_dp3", out, o); });
  EXPECT_NE(e.find("records no audit"), std::string::npos) << e;
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

}  // namespace
}  // namespace union_executor_test
}  // namespace ucpkit::to_universal
