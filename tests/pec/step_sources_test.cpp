// The pieces behind issue 28 items 1, 4, 5 without running the tools: command-line paths made
// absolute, a checkpoint's step checked or inferred from its sources (a tokens folder's file of a step:
// tokens_test.cpp), and unknown PLT kept unknown through the report's JSON and the run's history.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "pec/paths.h"
#include "pec/plt.h"
#include "pec/step_sources.h"
#include "pec/tokens.h"
#include "support/process.h"

namespace step_sources_test {

namespace fs = std::filesystem;
using namespace ucpkit;
using namespace ucpkit::pec;

namespace {
// The message of the UsageError `f` throws ("" when it throws none).
template <class F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }
}  // namespace

TEST(PecPaths, AbsoluteFromTheWorkingFolderWithoutDotsOrTrailingSlashes) {
  const std::string cwd = fs::current_path().string();
  EXPECT_EQ(absolute_path("ckpt"), cwd + "/ckpt");
  EXPECT_EQ(absolute_path("ckpt/"), cwd + "/ckpt");
  EXPECT_EQ(absolute_path("./ckpt//global_step100/"), cwd + "/ckpt/global_step100");
  EXPECT_EQ(absolute_path("."), cwd);
  EXPECT_EQ(absolute_path("/a/./b/"), "/a/b");
  EXPECT_EQ(absolute_path("a/../b"), cwd + "/a/../b");  // left to the system (a may be a link)
  EXPECT_EQ(absolute_path(".."), fs::path(cwd).parent_path().string());
  EXPECT_EQ(absolute_path(""), "");
}

TEST(PecStepSources, StepOfTag) {
  EXPECT_EQ(step_of_tag("global_step300"), 300);
  EXPECT_EQ(step_of_tag("global_step0"), 0);
  EXPECT_FALSE(step_of_tag("best"));
  EXPECT_FALSE(step_of_tag("global_step"));
  EXPECT_FALSE(step_of_tag("global_step12x"));
  EXPECT_FALSE(step_of_tag("global_step99999999999999999999"));  // does not fit: not a step
}

TEST(PecStepSources, GivenStepMustAgreeWithEverySource) {
  const std::vector<StepSource> sources = {{300, "the tag folder name global_step300"},
                                           {300, "ckpt/latest (names global_step300)"},
                                           {300, "global_steps in m.pt"},
                                           {300, "iteration in m.pt"}};
  const ResolvedStep ok = resolve_step(300, sources, "ckpt");
  EXPECT_EQ(ok.step, 300);
  EXPECT_FALSE(ok.inferred);
  const std::string e = usage_error_of([&] { resolve_step(200, sources, "ckpt"); });
  EXPECT_TRUE(contains(e, "--step 200")) << e;
  EXPECT_TRUE(contains(e, "step 300 from the tag folder name global_step300, ckpt/latest (names global_step300), "
                          "global_steps in m.pt, iteration in m.pt"))
      << e;
  // One source off is enough, and only it is named.
  const std::vector<StepSource> renamed = {{200, "the tag folder name global_step200"}, {300, "global_steps in m.pt"}};
  const std::string e2 = usage_error_of([&] { resolve_step(200, renamed, "ckpt"); });
  EXPECT_TRUE(contains(e2, "step 300 from global_steps in m.pt")) << e2;
  EXPECT_FALSE(contains(e2, "tag folder")) << e2;
  // A custom tag and no model states: nothing to disagree with.
  EXPECT_EQ(resolve_step(7, {}, "ckpt").step, 7);
}

TEST(PecStepSources, MissingStepIsInferredWhenTheSourcesAgree) {
  const ResolvedStep r = resolve_step(-1, {{500, "the tag folder name global_step500"}, {500, "iteration in m.pt"}}, "ckpt");
  EXPECT_EQ(r.step, 500);
  EXPECT_TRUE(r.inferred);
  EXPECT_EQ(r.from, "the tag folder name global_step500, iteration in m.pt");
  // No source: --step is required (a usage error).
  EXPECT_TRUE(contains(usage_error_of([] { resolve_step(-1, {}, "ckpt"); }), "--step is required"));
  // Sources that disagree: corrupt input (Error), both named.
  try {
    resolve_step(-1, {{200, "the tag folder name global_step200"}, {300, "global_steps in m.pt"}}, "ckpt");
    FAIL() << "no error";
  } catch (const UsageError&) {
    FAIL() << "a usage error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "ckpt: ")) << e.what();
    EXPECT_TRUE(contains(e.what(), "step 200 from the tag folder name global_step200; step 300 from global_steps in m.pt"))
        << e.what();
  }
}

TEST(PecPlt, UnknownIsNullAndStaysUnknownInTheHistory) {
  const nlohmann::json unknown = plt_to_json(std::nullopt);
  EXPECT_TRUE(unknown["overall"].is_null());
  EXPECT_TRUE(unknown["per_layer"].is_null());
  EXPECT_EQ(plt_to_json(Plt{0.25, {0.5, 0.0}})["overall"], 0.25);
  PltHistory h;
  add_restore(h, 100, TokenMatrix{{1, 2}});
  ASSERT_TRUE(total_lost(h, {2}));
  EXPECT_EQ(*total_lost(h, {2}), TokenMatrix({{1, 2}}));
  add_restore(h, 200, std::nullopt);  // a restore without token counts
  EXPECT_FALSE(total_lost(h, {2}));   // the sum would be a false lower bound
  const std::string d = ucpkit::testing::scratch_dir("plt_history_unknown");
  save_plt_history(d, h);
  const PltHistory back = load_plt_history(d);
  ASSERT_EQ(back.restores.size(), 2u);
  EXPECT_EQ(back.restores[0].second, TokenMatrix({{1, 2}}));
  EXPECT_FALSE(back.restores[1].second);
  // Restoring step 200 again, with counts, replaces the unknown record.
  add_restore(h, 200, TokenMatrix{{0, 5}});
  ASSERT_TRUE(total_lost(h, {2}));
  EXPECT_EQ(*total_lost(h, {2}), TokenMatrix({{1, 7}}));
}

}  // namespace step_sources_test
