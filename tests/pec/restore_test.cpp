// pec/restore.h in-process: pec_restore of stores pec_save made from the `ds` fixture chain (tests/pec/
// fixtures.py: each step its own values, token counts per interval in tokens/step<N>.json), checked against
// the fixture's own files and token counts; pec_restore_plan and its refusals; report_table's text.
#include "pec/restore.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "pec/save.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace restore_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::pec::pec_restore;
using ucpkit::pec::pec_restore_plan;
using ucpkit::pec::RestoreOptions;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;
using ucpkit::testing::tree_bytes;

namespace {

std::string step_dir(int step) { return kFx + "/ds/step" + std::to_string(step); }

// pec-save of the fixture's `step` into `store`: K experts per layer (sequential), the fixture's token counts.
void save(const std::string& store, int step, int k) {
  ucpkit::pec::SaveOptions o;
  o.checkpoint = step_dir(step);
  o.store = store;
  o.k = k;
  o.keep = 5;
  o.tokens = kFx + "/tokens";
  ucpkit::pec::pec_save(o);
}

// A fresh store holding the steps of `steps` (the first saves every expert: bootstrap).
std::string store_of(const std::string& name, const std::vector<int>& steps, int k = 1) {
  const std::string dir = ucpkit::testing::scratch_dir("restore-" + name);
  for (int s : steps) save(dir + "/store", s, k);
  return dir;
}

RestoreOptions options(const std::string& dir) {
  RestoreOptions o;
  o.store = dir + "/store";
  o.output = dir + "/out";
  return o;
}

json tokens_of(int step) { return json::parse(file_bytes(kFx + "/tokens/step" + std::to_string(step) + ".json")); }

std::string expert_file(int l, int e) {
  return "layer_" + std::to_string(l) + "_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
}
}  // namespace

TEST(PecRestore, AFullSaveRestoresEveryFileOfItsStepByteForByte) {
  const std::string dir = store_of("full", {100});
  std::vector<std::string> warnings;
  RestoreOptions o = options(dir);
  o.reporter.warn = [&](const std::string& w) { warnings.push_back(w); };
  const ucpkit::pec::RestoreResult r = pec_restore(o);
  EXPECT_EQ(r.output_dir, dir + "/out/global_step100");
  EXPECT_EQ(file_bytes(dir + "/out/latest"), "global_step100");
  EXPECT_EQ(tree_bytes(r.output_dir), tree_bytes(step_dir(100) + "/global_step100"));
  uint64_t bytes = 0;
  for (const auto& [rel, b] : tree_bytes(r.output_dir)) bytes += b.size();
  EXPECT_EQ(r.bytes_written, bytes);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  EXPECT_EQ(r.warnings, warnings);

  const json& rep = r.report;
  EXPECT_EQ(rep["step"], 100);
  EXPECT_EQ(rep["layout"], "deepspeed-moe");
  EXPECT_EQ(rep["experts"].size(), 8u);  // 2 MoE layers x 4 experts
  for (const auto& e : rep["experts"]) {
    EXPECT_EQ(e["restored_step"], 100);
    EXPECT_EQ(e["lost_tokens"], 0);
    EXPECT_EQ(e["tier"], "durable");
  }
  EXPECT_EQ(rep["plt"]["overall"], 0.0);
  EXPECT_EQ(rep["capacity_plan"].size(), 0u);
  EXPECT_EQ(rep["from_source"], json({{"step", 100}, {"ds_version", "as saved"}}));
  EXPECT_EQ(rep["restores_counted"], 1);
  EXPECT_TRUE(rep["warnings"].empty());
}

TEST(PecRestore, ExpertsNotSavedAtTheTargetComeFromTheOlderStepAndLoseItsInterval) {
  const std::string dir = store_of("chain", {100, 200});
  RestoreOptions o = options(dir);
  o.plt_threshold = 0.5;
  const ucpkit::pec::RestoreResult r = pec_restore(o);
  const json& rep = r.report;
  EXPECT_EQ(rep["step"], 200);
  const json t100 = tokens_of(100), t200 = tokens_of(200);
  std::map<int, int> from_target;  // per layer
  std::vector<double> lost(2, 0), all(2, 0);
  for (const auto& e : rep["experts"]) {
    const int l = e["moe_layer"], x = e["expert"];
    const int64_t step = e["restored_step"];
    ASSERT_TRUE(step == 100 || step == 200) << e.dump();
    const int64_t want_lost = step == 200 ? 0 : t200[l][x].get<int64_t>();
    EXPECT_EQ(e["lost_tokens"], want_lost) << e.dump();
    from_target[l] += step == 200;
    lost[l] += static_cast<double>(want_lost);
    all[l] += t100[l][x].get<double>() + t200[l][x].get<double>();
    // The expert's own file is the one of the step it came from.
    EXPECT_EQ(
        file_bytes(r.output_dir + "/" + expert_file(l, x)),
        file_bytes(step_dir(static_cast<int>(step)) + "/global_step" + std::to_string(step) + "/" + expert_file(l, x)))
        << e.dump();
  }
  EXPECT_EQ(from_target, (std::map<int, int>{{0, 1}, {1, 1}}));  // K = 1 per layer
  // PLT per layer: tokens lost over all tokens routed in the layer; overall: their mean.
  for (int l = 0; l < 2; ++l) EXPECT_NEAR(rep["plt"]["per_layer"][l].get<double>(), lost[l] / all[l], 1e-12) << l;
  EXPECT_NEAR(rep["plt"]["overall"].get<double>(), (lost[0] / all[0] + lost[1] / all[1]) / 2, 1e-12);
  EXPECT_EQ(rep["k"], 1);
  EXPECT_EQ(rep["next_k"], 1);                 // under the threshold of 50%
  EXPECT_EQ(rep["capacity_plan"].size(), 6u);  // each expert that lost tokens
  // The non-expert state is step 200's.
  EXPECT_EQ(file_bytes(r.output_dir + "/mp_rank_00_model_states.pt"),
            file_bytes(step_dir(200) + "/global_step200/mp_rank_00_model_states.pt"));

  // The table names the six older experts and counts the other two.
  const std::string table = ucpkit::pec::report_table(rep);
  EXPECT_NE(table.find("restored step 200  PLT "), std::string::npos) << table;
  EXPECT_NE(table.find("(2 experts restored from step 200 itself)\n"), std::string::npos) << table;
  EXPECT_NE(table.find("6 experts need extra capacity (see capacity_plan)\n"), std::string::npos) << table;
}

TEST(PecRestore, StepOptionRestoresAnOlderCommittedStepAndTheOutputMayNameItsFolder) {
  const std::string dir = store_of("older", {100, 200});
  RestoreOptions o = options(dir);
  o.step = 100;
  o.output = dir + "/out/global_step100";  // the step folder itself: its parent is meant
  const ucpkit::pec::RestoreResult r = pec_restore(o);
  EXPECT_EQ(r.output_dir, dir + "/out/global_step100");
  EXPECT_EQ(tree_bytes(r.output_dir), tree_bytes(step_dir(100) + "/global_step100"));
  EXPECT_FALSE(r.report["from_source"].contains("step"));  // given, not chosen

  // Once there, the same restore is refused unless forced.
  const std::string e = error_of([&] { pec_restore(o); });
  EXPECT_NE(e.find("already exists (use --overwrite to replace it)"), std::string::npos) << e;
  o.force = true;
  EXPECT_EQ(pec_restore(o).report["step"], 100);
}

TEST(PecRestore, PlanWritesNothingAndRefusesAsTheRestoreWould) {
  const std::string dir = store_of("plan", {100, 200});
  RestoreOptions o = options(dir);
  const ucpkit::pec::RestorePlan plan = pec_restore_plan(o);
  EXPECT_EQ(plan.step, 200);
  EXPECT_FALSE(fs::exists(dir + "/out"));
  o.step = 100;
  EXPECT_EQ(pec_restore_plan(o).step, 100);

  // A step folder of another step than the one restored.
  o.step = -1;
  o.output = dir + "/out/global_step300";
  const std::string named = error_of([&] { pec_restore_plan(o); });
  EXPECT_NE(named.find("is the step folder of step 300, but step 200 is restored"), std::string::npos) << named;
  EXPECT_NE(named.find("or --step 300"), std::string::npos) << named;
  EXPECT_THROW(pec_restore(o), ucpkit::UsageError);
  EXPECT_FALSE(fs::exists(dir + "/out"));  // a refusal leaves no output folder

  // A step never committed; a store that is not there; a DeepSpeed line that does not exist.
  o = options(dir);
  o.step = 150;
  EXPECT_NE(error_of([&] { pec_restore_plan(o); }).find("150"), std::string::npos);
  o = options(dir);
  o.store = dir + "/nothing";
  EXPECT_NE(error_of([&] { pec_restore_plan(o); }).find(dir + "/nothing"), std::string::npos);
  o = options(dir);
  o.ds_version = "0.0.1";
  EXPECT_THROW(pec_restore_plan(o), ucpkit::UsageError);
  o = options(dir);
  o.tokens = dir + "/no-tokens";
  EXPECT_NE(error_of([&] { pec_restore_plan(o); }).find("no-tokens"), std::string::npos);
  o = options(dir);
  o.memory_mb = 0;
  EXPECT_THROW(pec_restore_plan(o), ucpkit::UsageError);
  EXPECT_FALSE(fs::exists(dir + "/out"));
}

TEST(PecRestore, AMissingFastTierIsAWarningAndTheDurableStoreRestores) {
  const std::string dir = store_of("fast", {100});
  RestoreOptions o = options(dir);
  o.fast_store = dir + "/lost-fast";
  std::vector<std::string> warnings;
  o.reporter.warn = [&](const std::string& w) { warnings.push_back(w); };
  const ucpkit::pec::RestoreResult r = pec_restore(o);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            dir + "/lost-fast: fast tier missing (lost with its node?); restoring from the durable store only");
  EXPECT_EQ(r.report["warnings"], json(warnings));
  EXPECT_EQ(tree_bytes(r.output_dir), tree_bytes(step_dir(100) + "/global_step100"));
}

TEST(PecRestore, ReportTableOfAHandMadeReport) {
  const json r = {
      {"step", 300},
      {"plt", {{"overall", 0.0125}, {"per_layer", {0.02, 0.005}}}},
      {"plt_threshold", 0.0375},
      {"plt_accumulated", {{"overall", 0.03}}},
      {"restores_counted", 2},
      {"k", 1},
      {"next_k", 2},
      {"from_source", {{"step", 300}}},
      {"experts",
       {{{"moe_layer", 0}, {"expert", 0}, {"restored_step", 300}, {"lost_tokens", 0}, {"tier", "fast"}},
        {{"moe_layer", 0}, {"expert", 1}, {"restored_step", 200}, {"lost_tokens", 42}, {"tier", "durable"}},
        {{"moe_layer", 1}, {"expert", 0}, {"restored_step", 100}, {"lost_tokens", nullptr}, {"tier", "durable"}}}},
      {"capacity_plan", json::array()}};
  EXPECT_EQ(ucpkit::pec::report_table(r),
            "restored step 300  PLT 1.2500% (threshold 3.7500%)  K 1 -> next K 2\n"
            "accumulated PLT over 2 restores of this run: 3.0000% (drives next K)\n"
            "from the store: step 300 (newest committed; no --step)\n"
            "moe_layer  expert  restored_step  lost_tokens  tier\n"
            "        0       1            200           42  durable\n"
            "        1       0            100      unknown  durable\n"
            "(1 experts restored from step 300 itself)\n"
            "PLT per MoE layer: 0:2.000% 1:0.500%\n");

  // The budget policy's line; an unknown PLT says why K is kept.
  json b = r;
  b["budget_bytes"] = 1000;
  b["next_budget_bytes"] = 2000;
  b["k_per_layer"] = {1, 2};
  b["plt"] = {{"overall", nullptr}, {"per_layer", nullptr}};
  b["next_k_reason"] = "no token counts: K kept";
  b["restores_counted"] = 1;
  b["from_source"] = {{"ds_version", "as saved"}};
  b["capacity_plan"] = {{{"x", 1}}};
  const std::string t = ucpkit::pec::report_table(b);
  EXPECT_EQ(t.rfind("restored step 300  PLT unknown (threshold 3.7500%)  budget 1000 B (K per layer 1,2) -> next "
                    "budget 2000 B\nno token counts: K kept\n"
                    "from the store: DeepSpeed version line as saved (no --ds-version)\n",
                    0),
            0u)
      << t;
  EXPECT_NE(t.find("PLT per MoE layer: unknown\n1 experts need extra capacity (see capacity_plan)\n"),
            std::string::npos)
      << t;
}

}  // namespace restore_test
