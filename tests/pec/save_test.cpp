// pec/save.h in-process: check_save_options' refusals, and pec_save of the `ds` fixture chain (tests/pec/
// fixtures.py) read back through pec::Store: the summary, the manifest (every non-expert file and the
// selected experts, each stored file equal to the fixture's bytes once its cut ranges are put back), the
// token counts of tokens/step<N>.json, the plan, the step checks, the fast tier and the refusals.
#include "pec/save.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "pec/store.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "support/process.h"

namespace save_test {

namespace fs = std::filesystem;
using nlohmann::json;
using ucpkit::pec::check_save_options;
using ucpkit::pec::pec_save;
using ucpkit::pec::SaveOptions;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;

namespace {

std::string step_dir(int step) { return kFx + "/ds/step" + std::to_string(step); }
std::string tag_dir(int step) { return step_dir(step) + "/global_step" + std::to_string(step); }

SaveOptions options(const std::string& store, int step, int k = 1) {
  SaveOptions o;
  o.checkpoint = step_dir(step);
  o.store = store;
  o.k = k;
  o.keep = 5;
  o.tokens = kFx + "/tokens";
  return o;
}

std::string usage_error(const SaveOptions& o) {
  try {
    check_save_options(o);
  } catch (const ucpkit::UsageError& e) {
    return e.what();
  }
  return "";
}

json tokens_of(int step) { return json::parse(file_bytes(kFx + "/tokens/step" + std::to_string(step) + ".json")); }

// The file as the store holds it: its bytes without the cut ranges (the expert fragments).
std::string without_cut(const std::string& path, const ucpkit::pec::FileEntry& f) {
  const std::string b = file_bytes(path);
  if (!f.cut) return b;
  EXPECT_EQ(f.cut->file_size, b.size()) << path;
  std::string kept;
  uint64_t at = 0;
  for (const auto& [offset, n] : f.cut->cut) {
    kept += b.substr(at, offset - at);
    at = offset + n;
  }
  return kept + b.substr(at);
}
}  // namespace

TEST(PecSave, OptionsThatCannotWorkAreUsageErrors) {
  SaveOptions o;
  o.k = 1;
  EXPECT_EQ(usage_error(o), "");  // sequential needs no tokens
  auto with = [&](auto change) {
    SaveOptions x = o;
    change(x);
    return usage_error(x);
  };
  EXPECT_EQ(with([](SaveOptions& x) { x.fast_store = "f"; }), "--fast-store needs --k-snapshot K1 >= 1");
  EXPECT_EQ(with([](SaveOptions& x) { x.k_snapshot = 1; }), "--k-snapshot needs --fast-store");
  EXPECT_EQ(with([](SaveOptions& x) { x.k = -1; }), "--k and --k-persist must be >= 1");
  EXPECT_EQ(with([](SaveOptions& x) { x.k = 0; }),
            "give --k >= 1 (or --k-persist, or --budget-bytes with the budget policy)");
  EXPECT_EQ(with([](SaveOptions& x) { x.k = 0, x.k_persist = 2; }), "");
  EXPECT_EQ(with([](SaveOptions& x) { x.zstd_level = 23; }), "--zstd-level must be 0..22");
  EXPECT_EQ(with([](SaveOptions& x) { x.zstd_level = 22; }), "");
  EXPECT_EQ(with([](SaveOptions& x) { x.chunk_bytes = 0; }), "--chunk-mib must be >= 1");
  EXPECT_EQ(with([](SaveOptions& x) { x.policy = "load-aware"; }),
            "the load-aware policy needs --tokens (token counts since the previous save)");
  EXPECT_EQ(with([](SaveOptions& x) { x.policy = "budget", x.k = 0, x.budget_bytes = 1000, x.tokens = "t"; }), "");
  EXPECT_NE(with([](SaveOptions& x) { x.policy = "no-such-policy"; }).find("no-such-policy"), std::string::npos);
}

TEST(PecSave, FirstSaveStoresEveryFileAndEveryExpertWithTheIntervalTokens) {
  const std::string store = ucpkit::testing::scratch_dir("save-first") + "/store";
  uint64_t total = 0, done = 0;
  const json s = pec_save(
      options(store, 100), [&](uint64_t n) { done += n; }, &total);
  EXPECT_EQ(s["step"], 100);
  EXPECT_EQ(s["step_inferred"], true);
  EXPECT_EQ(s["layout"], "deepspeed-moe");
  EXPECT_EQ(s["experts_per_layer"], json({4, 4}));
  EXPECT_EQ(s["ep_size"], 2);
  EXPECT_EQ(s["world_size"], 1);
  EXPECT_EQ(s["tokens_known"], true);
  uint64_t on_disk = 0;
  for (const auto& e : fs::directory_iterator(tag_dir(100))) on_disk += e.file_size();
  EXPECT_EQ(s["non_expert_bytes"].get<uint64_t>() + s["expert_bytes"].get<uint64_t>(), on_disk);
  EXPECT_GT(total, 0u);
  EXPECT_EQ(done, total);
  ASSERT_EQ(s["tiers"].size(), 1u);
  EXPECT_EQ(s["tiers"][0]["tier"], "durable");
  EXPECT_EQ(s["tiers"][0]["stats"]["experts_saved"], 8);  // bootstrap: the first save is full

  const ucpkit::pec::Store st(store, ucpkit::pec::Tier::durable, ucpkit::pec::StoreOpen::existing);
  ASSERT_EQ(st.committed_steps(), std::vector<int64_t>{100});
  const ucpkit::pec::Manifest m = st.load_manifest(100);
  EXPECT_EQ(m.tag, "global_step100");
  EXPECT_EQ(m.policy, "sequential");
  EXPECT_EQ(m.k, 1);
  EXPECT_EQ(m.experts.size(), 8u);
  EXPECT_EQ(m.tokens_interval, tokens_of(100).get<ucpkit::pec::TokenMatrix>());
  EXPECT_EQ(m.tokens_cumulative, m.tokens_interval);
  // Non-expert files: every file that is no expert's own, each read back as the fixture's bytes with
  // the expert fragments cut out (zeroed).
  std::set<std::string> names;
  size_t cut = 0;
  for (const auto& f : m.non_expert) {
    names.insert(f.path);
    const auto b = st.read_file(f);
    EXPECT_TRUE(std::string(b.begin(), b.end()) == without_cut(tag_dir(100) + "/" + f.path, f)) << f.path;
    cut += f.cut.has_value();
  }
  EXPECT_EQ(names,
            (std::set<std::string>{
                "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt",
                "expp_rank_0_mp_rank_00_optim_states.pt", "expp_rank_1_mp_rank_00_optim_states.pt",
                "mp_rank_00_model_states.pt"}));
  EXPECT_GT(cut, 0u);  // the optimizer shards holding expert fragments
  const ucpkit::pec::ExpertEntry* x = m.find_expert(1, 2);
  ASSERT_NE(x, nullptr);
  bool own_file = false;
  for (const auto& f : x->files)
    if (f.path == "layer_1_expert_2_mp_rank_00_model_states.pt") {
      own_file = true;
      const auto b = st.read_file(f);
      EXPECT_TRUE(std::string(b.begin(), b.end()) == file_bytes(tag_dir(100) + "/" + f.path));
    }
  EXPECT_TRUE(own_file);
}

TEST(PecSave, LaterSaveStoresKExpertsPerLayerAndAddsTheTokens) {
  const std::string store = ucpkit::testing::scratch_dir("save-second") + "/store";
  pec_save(options(store, 100));
  const json s = pec_save(options(store, 200));
  EXPECT_EQ(s["step"], 200);
  EXPECT_EQ(s["tiers"][0]["stats"]["experts_saved"], 2);  // K = 1 of 4 in each of the 2 layers
  const ucpkit::pec::Store st(store, ucpkit::pec::Tier::durable, ucpkit::pec::StoreOpen::existing);
  EXPECT_EQ(st.committed_steps(), (std::vector<int64_t>{100, 200}));
  const ucpkit::pec::Manifest m = st.load_manifest(200);
  EXPECT_EQ(m.experts.size(), 2u);
  EXPECT_EQ(m.k_per_layer, (std::vector<int>{1, 1}));
  EXPECT_EQ(m.save_index, 1);
  const json t100 = tokens_of(100), t200 = tokens_of(200);
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(m.tokens_interval[l][e], t200[l][e].get<int64_t>());
      EXPECT_EQ(m.tokens_cumulative[l][e], t100[l][e].get<int64_t>() + t200[l][e].get<int64_t>());
      EXPECT_EQ(m.last_saved_step[l][e], m.find_expert(l, e) ? 200 : 100) << l << " " << e;
    }

  // The same step, or an older one, again: refused naming the store.
  const std::string again = error_of([&] { pec_save(options(store, 200)); });
  EXPECT_NE(again.find("step 200 is not newer than its latest committed step 200"), std::string::npos) << again;
  EXPECT_NE(again.find(store), std::string::npos) << again;
  EXPECT_EQ(error_of([&] { pec_save(options(store, 100)); }).find("not newer") != std::string::npos, true);
}

TEST(PecSave, PlanOnlyCreatesNothingAndCountsTheSelection) {
  const std::string store = ucpkit::testing::scratch_dir("save-plan") + "/store";
  SaveOptions o = options(store, 100);
  o.plan_only = true;
  const json plan = pec_save(o);
  EXPECT_FALSE(fs::exists(store));
  EXPECT_EQ(plan["step"], 100);
  EXPECT_EQ(plan["step_inferred"], true);
  // The first save of a store: every expert of both layers (bootstrap).
  EXPECT_EQ(plan["selection"], json({{"durable", {{0, 1, 2, 3}, {0, 1, 2, 3}}}})) << plan["selection"].dump();
}

TEST(PecSave, GivenStepMustAgreeWithTheCheckpoint) {
  const std::string store = ucpkit::testing::scratch_dir("save-step") + "/store";
  SaveOptions o = options(store, 100);
  o.step = 300;
  const std::string e = error_of([&] { pec_save(o); });
  EXPECT_NE(e.find("300"), std::string::npos) << e;
  EXPECT_NE(e.find("100"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(store));  // a refused save leaves no store folder
  o.step = 100;
  const json s = pec_save(o);
  EXPECT_EQ(s["step"], 100);
  EXPECT_EQ(s["step_inferred"], false);
}

TEST(PecSave, StoreInsideTheCheckpointAndMissingTokenFilesAreRefused) {
  const std::string dir = ucpkit::testing::scratch_dir("save-inside");
  fs::copy(step_dir(100), dir + "/ck", fs::copy_options::recursive);
  const std::string inside = dir + "/ck/global_step100/store";
  SaveOptions o = options(inside, 100);
  o.checkpoint = dir + "/ck";
  const std::string e = error_of([&] { pec_save(o); });
  EXPECT_NE(e.find("--store " + inside + " is inside the checkpoint folder"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(inside));

  o = options(dir + "/store", 100);
  o.tokens = dir + "/no-tokens";
  EXPECT_NE(error_of([&] { pec_save(o); }).find("no-tokens"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir + "/store"));
}

TEST(PecSave, FastTierHoldsItsOwnSelection) {
  const std::string dir = ucpkit::testing::scratch_dir("save-fast");
  SaveOptions o = options(dir + "/store", 100);
  o.fast_store = dir + "/fast";
  o.k_snapshot = 2;
  const json s = pec_save(o);
  ASSERT_EQ(s["tiers"].size(), 2u);
  EXPECT_EQ(s["tiers"][1]["tier"], "fast");
  EXPECT_EQ(s["tiers"][1]["k"], 2);
  const ucpkit::pec::Store fast(dir + "/fast", ucpkit::pec::Tier::fast, ucpkit::pec::StoreOpen::existing);
  EXPECT_EQ(fast.committed_steps(), std::vector<int64_t>{100});
  EXPECT_EQ(fast.load_manifest(100).tier, ucpkit::pec::Tier::fast);
}

}  // namespace save_test
