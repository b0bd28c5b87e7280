// inspect/diff.h in-process: diff_checkpoints of the generated native checkpoints (tests/inspect/fixtures.py:
// moe_changed holds one exp_avg value moved by 0.25, named in changed.json; moe_damaged one flipped byte),
// the tolerance, the listed limit, the temporary folder, the refusals, and DiffResult's JSON and text forms.
#include "inspect/diff.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace diff_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::inspect::diff_checkpoints;
using ucpkit::inspect::DiffOptions;
using ucpkit::inspect::DiffResult;
using ucpkit::inspect::TensorDifference;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;

namespace {
const std::string kMoe = kFx + "/moe_dp4_ep2_fp16";

json fixture_json(const std::string& name, const std::string& file) {
  return json::parse(file_bytes(kFx + "/" + name + "/" + file));
}

// Options converting into a fresh folder of the test's own (checked empty afterwards).
DiffOptions options_in(const std::string& tmp) {
  DiffOptions o;
  o.tmp_dir = tmp;
  o.threads = 2;
  return o;
}
}  // namespace

TEST(InspectDiff, NegativeOrNanToleranceIsAUsageError) {
  DiffOptions o;
  o.rtol = -1;
  EXPECT_NE(error_of([&] { diff_checkpoints(kMoe, kMoe, o); }).find("--rtol and --atol must be numbers >= 0"),
            std::string::npos);
  o.rtol = 0;
  o.atol = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(diff_checkpoints(kMoe, kMoe, o), ucpkit::UsageError);
}

TEST(InspectDiff, ACheckpointEqualsItselfAndTheConversionsAreRemoved) {
  const std::string tmp = ucpkit::testing::scratch_dir("diff-self");
  DiffOptions o = options_in(tmp);
  std::vector<std::string> details;
  o.reporter.verbose = [&](const std::string& m) { details.push_back(m); };
  const DiffResult r = diff_checkpoints(kMoe, kMoe, o);
  EXPECT_TRUE(r.equal());
  EXPECT_EQ(r.a.input, kMoe);
  EXPECT_EQ(r.a.form, "native");
  EXPECT_EQ(r.b.form, "native");
  // fp32, exp_avg, exp_avg_sq of every parameter, and the non-tensor items: each parameter's step and
  // the param_groups.
  const size_t params = fixture_json("moe_dp4_ep2_fp16", "expect.json")["tensors"];
  EXPECT_EQ(r.items, params + 1);
  EXPECT_EQ(r.tensors, 3 * params + r.items);
  EXPECT_EQ(r.tensors_equal, r.tensors);
  EXPECT_EQ(r.differences, 0u);
  EXPECT_TRUE(r.listed.empty());
  EXPECT_EQ(r.skipped, (std::vector<std::string>{"model files' client state", "other non-tensor items"}));
  EXPECT_TRUE(fs::is_empty(tmp));
  size_t converting = 0;
  for (const auto& d : details) converting += d.rfind("converting " + kMoe + " to universal form in " + tmp, 0) == 0;
  EXPECT_EQ(converting, 2u);
  EXPECT_EQ(r.text().rfind("equal: all " + std::to_string(r.tensors) + " entries (", 0), 0u) << r.text();
}

TEST(InspectDiff, OneMovedValueIsTheOnlyDifferenceAndATolerancePassesIt) {
  const std::string tmp = ucpkit::testing::scratch_dir("diff-changed");
  const json changed = fixture_json("moe_changed", "changed.json");
  const DiffResult r = diff_checkpoints(kMoe, kFx + "/moe_changed", options_in(tmp));
  EXPECT_FALSE(r.equal());
  EXPECT_EQ(r.differences, 1u);
  EXPECT_EQ(r.tensors_equal + 1, r.tensors);
  ASSERT_EQ(r.listed.size(), 1u);
  const TensorDifference& d = r.listed[0];
  EXPECT_EQ(d.param, changed["param"]);
  EXPECT_EQ(d.state, changed["state"]);
  EXPECT_EQ(d.kind, "values");
  EXPECT_EQ(d.differing, 1);
  EXPECT_GT(d.elements, 1);
  EXPECT_NEAR(d.max_abs_diff, 0.25, 1e-6);
  EXPECT_NE(d.detail.find("1 of " + std::to_string(d.elements) + " elements differ, max abs diff 0.25"),
            std::string::npos)
      << d.detail;
  EXPECT_TRUE(fs::is_empty(tmp));

  // |a - b| <= atol + rtol * |b|: 0.3 absolute covers it.
  DiffOptions o = options_in(tmp);
  o.atol = 0.3;
  const DiffResult within = diff_checkpoints(kMoe, kFx + "/moe_changed", o);
  EXPECT_TRUE(within.equal());
  EXPECT_EQ(within.tensors_equal, within.tensors);
  EXPECT_EQ(within.to_json()["comparison"], "tolerance");
}

TEST(InspectDiff, ParametersInOneOnlyCountEachStateAndTheListIsCut) {
  const std::string tmp = ucpkit::testing::scratch_dir("diff-models");
  DiffOptions o = options_in(tmp);
  o.listed = 3;
  const DiffResult r = diff_checkpoints(kFx + "/gpt_tp2_pp2_dp2", kMoe, o);
  EXPECT_FALSE(r.equal());
  EXPECT_EQ(r.differences, r.tensors - r.tensors_equal);
  ASSERT_EQ(r.listed.size(), 3u);  // the first 3 of them
  // The whole text: a "... N more" line for the rest.
  EXPECT_NE(r.text().find("  ... " + std::to_string(r.differences - 3) + " more tensors differ\n"), std::string::npos)
      << r.text();

  o.listed = 100000;
  const DiffResult all = diff_checkpoints(kFx + "/gpt_tp2_pp2_dp2", kMoe, o);
  EXPECT_EQ(all.differences, r.differences);
  size_t only_a = 0, only_b = 0;
  for (const auto& d : all.listed) {
    if (d.kind == "only_in_a" && d.state.empty()) {
      ++only_a;
      EXPECT_EQ(d.detail, "parameter in " + kFx + "/gpt_tp2_pp2_dp2 only");
    }
    if (d.kind == "only_in_b" && d.state.empty()) {
      ++only_b;
      EXPECT_EQ(d.detail, "parameter in " + kMoe + " only");
    }
  }
  EXPECT_GT(only_a, 0u);
  EXPECT_GT(only_b, 0u);
  EXPECT_EQ(all.listed.size(), all.differences - (only_a + only_b) * 2);  // each whole parameter counts 3 states
  EXPECT_TRUE(fs::is_empty(tmp));
}

TEST(InspectDiff, ADamagedShardIsAnErrorNamingItAndLeavesNothingBehind) {
  const std::string tmp = ucpkit::testing::scratch_dir("diff-damaged");
  const std::string file = fixture_json("moe_damaged", "damaged.json")["file"];
  const std::string e = error_of([&] { diff_checkpoints(kMoe, kFx + "/moe_damaged", options_in(tmp)); });
  EXPECT_NE(e.find(file), std::string::npos) << e;
  EXPECT_TRUE(fs::is_empty(tmp));
}

TEST(InspectDiff, FoldersThatCannotBeComparedAreRefused) {
  const std::string tmp = ucpkit::testing::scratch_dir("diff-refused");
  const std::string empty = ucpkit::testing::scratch_dir("diff-empty");
  EXPECT_NE(error_of([&] { diff_checkpoints(empty, kMoe, options_in(tmp)); }).find("not a checkpoint"),
            std::string::npos);
  EXPECT_NE(error_of([&] { diff_checkpoints(kMoe, empty, options_in(tmp)); }).find(empty), std::string::npos);
  EXPECT_NE(error_of([&] { diff_checkpoints(kMoe, kMoe, options_in(tmp + "/missing")); }).find("--tmp-dir"),
            std::string::npos);
  EXPECT_TRUE(fs::is_empty(tmp));

  // A temporary folder inside a checkpoint would convert it into itself.
  const std::string copy = ucpkit::testing::scratch_dir("diff-copy") + "/ck";
  fs::copy(kMoe, copy, fs::copy_options::recursive);
  const std::string e = error_of([&] { diff_checkpoints(copy, kMoe, options_in(copy)); });
  EXPECT_NE(e.find("--tmp-dir"), std::string::npos) << e;
  for (const auto& entry : fs::directory_iterator(copy))
    EXPECT_EQ(entry.path().filename().string().rfind("ucp-diff-", 0), std::string::npos) << entry.path();
}

TEST(InspectDiff, JsonAndTextOfAHandMadeResult) {
  DiffResult r;
  r.a = {"x", "universal"};
  r.b = {"y", "native"};
  r.rtol = 0.5;
  r.tensors = 4;
  r.tensors_equal = 1;
  r.differences = 3;
  r.listed = {{"w", "exp_avg", "values", "1 of 4 elements differ, max abs diff inf", 4, 1, INFINITY},
              {"v", "", "only_in_b", "parameter in y only"}};
  const json j = r.to_json();
  EXPECT_EQ(j["equal"], false);
  EXPECT_EQ(j["a"], json({{"input", "x"}, {"form", "universal"}}));
  EXPECT_EQ(j["comparison"], "tolerance");
  EXPECT_EQ(j["rtol"], 0.5);
  EXPECT_EQ(j["non_tensor_items"], 0);
  EXPECT_EQ(j["listed"][0]["elements"], 4);
  EXPECT_EQ(j["listed"][0]["differing"], 1);
  EXPECT_TRUE(j["listed"][0]["max_abs_diff"].is_null());  // infinity is no JSON number
  EXPECT_TRUE(j["listed"][1]["state"].is_null());
  EXPECT_FALSE(j["listed"][1].contains("elements"));  // only values differences count elements
  EXPECT_EQ(r.text(),
            "differ: 1 of 4 tensors equal (within the tolerance)\n"
            "  w exp_avg: values: 1 of 4 elements differ, max abs diff inf\n"
            "  v: only_in_b: parameter in y only\n"
            "  ... 1 more tensors differ\n");

  DiffResult e;
  e.tensors = e.tensors_equal = 5;
  e.items = 2;
  e.skipped = {"p", "q"};
  EXPECT_TRUE(e.equal());
  EXPECT_EQ(e.to_json()["comparison"], "exact");
  EXPECT_EQ(e.text(), "equal: all 5 entries (3 tensors, 2 non-tensor items) (bit for bit; not compared: p, q)\n");
}

}  // namespace diff_test
