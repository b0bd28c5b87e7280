// pec-restore's plan builder on manifests made in memory (no store, no I/O): target step, fallbacks,
// each expert's sources in order (newest first, fast tier first among equal steps), refusals, the file
// sizes of the MPI split, the report inputs, and the JSON `pec-restore --plan` prints.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "pec/restore_plan.h"

namespace restore_plan_test {

using namespace ucpkit;
using namespace ucpkit::pec;
using nlohmann::json;

namespace {
// A file entry with one chunk whose object id says where it is from.
FileEntry file(const std::string& path, uint64_t size, const std::string& object) {
  FileEntry f;
  f.path = path;
  f.size = size;
  f.chunks.push_back({object, size, size});
  return f;
}

std::string oid(int n) {
  std::string s = std::to_string(n);
  return std::string(32 - s.size(), '0') + s;
}

// A manifest of `step` in `tier` holding the experts `experts` (MoE shape: 2 layers x 2 experts; the
// expert file of layer l expert e is 10 + l * 2 + e bytes) and, unless `pruned`, the non-expert file.
Manifest manifest(int64_t step, Tier tier, std::vector<std::pair<int, int>> experts, bool pruned = false) {
  Manifest m;
  m.step = step;
  m.tier = tier;
  m.layout = SourceLayout::DeepSpeedMoe;
  m.shape.experts_per_layer = {2, 2};
  m.policy = "sequential";
  m.k = 1;
  m.non_expert_pruned = pruned;
  if (!pruned) m.non_expert.push_back(file("mp_rank_00_model_states.pt", 100, oid(step)));
  for (auto [l, e] : experts) {
    const std::string path = "layer_" + std::to_string(l) + "_expert_" + std::to_string(e) + "_mp_rank_00_model_states.pt";
    m.experts.push_back({l, e, {file(path, static_cast<uint64_t>(10 + l * 2 + e), oid(static_cast<int>(step) + l * 2 + e + 1))}});
  }
  return m;
}

const std::vector<std::pair<int, int>> kAll = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};

// Stores: 0 durable, 1 fast. Copies in the order a restore reads them (store by store, steps ascending).
RestoreCatalog catalog(std::vector<ManifestCopy> copies) {
  RestoreCatalog c;
  c.stores = {{Tier::durable, "/s/durable"}, {Tier::fast, "/s/fast"}};
  c.copies = std::move(copies);
  return c;
}

RestoreRequest request(int64_t step = -1) { return {step, "/out", "", ""}; }

// (tier, step) of each source of expert (l, e), in the order the restore tries them.
std::vector<std::pair<Tier, int64_t>> sources(const RestorePlan& p, int l, int e) {
  std::vector<std::pair<Tier, int64_t>> v;
  for (const auto& x : p.experts)
    if (x.moe_layer == l && x.expert == e)
      for (size_t c : x.copies) v.emplace_back(p.catalog.stores[p.catalog.copies[c].store].tier, p.manifest(c).step);
  return v;
}
}  // namespace

TEST(PecRestorePlan, TargetIsTheNewestStepWithNonExpertStateAndOlderStepsAreFallbacks) {
  RestorePlan p = plan_restore(catalog({{0, manifest(100, Tier::durable, kAll)},
                                        {0, manifest(200, Tier::durable, {{0, 1}})},
                                        {0, manifest(300, Tier::durable, {{1, 0}}, true)}}),
                               request());
  EXPECT_EQ(p.step, 200);
  EXPECT_EQ(p.base_manifest().step, 200);
  ASSERT_EQ(p.targets.size(), 2u);
  EXPECT_EQ(p.targets[0].step, 200);
  EXPECT_EQ(p.targets[1].step, 100);
  // Step 300's copy of expert (1, 0) is newer than the target: not a source.
  EXPECT_EQ(sources(p, 1, 0), (std::vector<std::pair<Tier, int64_t>>{{Tier::durable, 100}}));
  EXPECT_EQ(sources(p, 0, 1), (std::vector<std::pair<Tier, int64_t>>{{Tier::durable, 200}, {Tier::durable, 100}}));
  EXPECT_EQ(p.timeline, (std::vector<int64_t>{100, 200}));
  EXPECT_EQ(restore_step_dir(p), "/out/global_step200");
}

TEST(PecRestorePlan, EachExpertFromItsNewestCopyTheFastTierFirstAmongEqualSteps) {
  RestorePlan p = plan_restore(catalog({{0, manifest(100, Tier::durable, kAll)},
                                        {0, manifest(200, Tier::durable, {{0, 1}})},
                                        {1, manifest(200, Tier::fast, {{0, 0}, {0, 1}})}}),
                               request());
  using V = std::vector<std::pair<Tier, int64_t>>;
  EXPECT_EQ(p.step, 200);
  EXPECT_EQ(p.catalog.stores[p.catalog.copies[p.base].store].tier, Tier::fast);  // non-expert state: fast first
  EXPECT_EQ(sources(p, 0, 0), (V{{Tier::fast, 200}, {Tier::durable, 100}}));
  EXPECT_EQ(sources(p, 0, 1), (V{{Tier::fast, 200}, {Tier::durable, 200}, {Tier::durable, 100}}));
  EXPECT_EQ(sources(p, 1, 1), (V{{Tier::durable, 100}}));
  ASSERT_EQ(p.targets[0].copies.size(), 2u);  // both tiers' state of step 200, fast first
  // The report's K is the durable tier's at the target, though the state comes from the fast tier.
  EXPECT_EQ(p.manifest(p.k_source).tier, Tier::durable);
  EXPECT_EQ(p.manifest(p.k_source).step, 200);
}

TEST(PecRestorePlan, StepOptionRestoresThatStepOnly) {
  RestorePlan p = plan_restore(catalog({{0, manifest(100, Tier::durable, kAll)}, {0, manifest(200, Tier::durable, kAll)}}),
                               request(100));
  EXPECT_EQ(p.step, 100);
  ASSERT_EQ(p.targets.size(), 1u);  // with --step no other step is tried
  EXPECT_EQ(sources(p, 1, 1), (std::vector<std::pair<Tier, int64_t>>{{Tier::durable, 100}}));
}

TEST(PecRestorePlan, RefusalsNameTheStore) {
  auto message = [](RestoreCatalog c, RestoreRequest r) {
    try {
      (void)plan_restore(std::move(c), std::move(r));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(catalog({}), request()).find("no committed step in the store"), std::string::npos);
  EXPECT_NE(message(catalog({{0, manifest(100, Tier::durable, kAll, true)}}), request()).find("no committed step with its non-expert"),
            std::string::npos);
  const std::string not_committed = message(catalog({{0, manifest(100, Tier::durable, kAll)}}), request(150));
  EXPECT_NE(not_committed.find("/s/durable"), std::string::npos) << not_committed;
  EXPECT_NE(not_committed.find("step 150 is not committed"), std::string::npos) << not_committed;
  const std::string missing = message(catalog({{0, manifest(100, Tier::durable, {{0, 0}, {0, 1}, {1, 0}})}}), request());
  EXPECT_NE(missing.find("expert 1 of MoE layer 1 has no intact copy at or before step 100"), std::string::npos) << missing;
}

TEST(PecRestorePlan, DsVersionIsRefusedForUniversalAndAutoEpZero3) {
  for (SourceLayout layout : {SourceLayout::Universal, SourceLayout::DeepSpeedAutoEpZero3}) {
    Manifest m = manifest(100, Tier::durable, kAll);
    m.layout = layout;
    EXPECT_THROW(plan_restore(catalog({{0, m}}), {-1, "/out", "", "0.19.5"}), UsageError) << to_string(layout);
    EXPECT_NO_THROW(plan_restore(catalog({{0, m}}), {-1, "/out", "", ""})) << to_string(layout);
  }
  EXPECT_NO_THROW(plan_restore(catalog({{0, manifest(100, Tier::durable, kAll)}}), {-1, "/out", "", "0.19.5"}));
}

TEST(PecRestorePlan, AimAtAnOlderStepFollowsWithSourcesFilesAndTimeline) {
  RestorePlan p = plan_restore(catalog({{0, manifest(100, Tier::durable, kAll)}, {0, manifest(200, Tier::durable, {{0, 0}})}}),
                               request());
  ASSERT_EQ(p.step, 200);
  EXPECT_EQ(sources(p, 0, 0).size(), 2u);
  // The restore falls back to step 100 when step 200's non-expert state proves damaged.
  aim_at(p, p.targets[1].copies[0]);
  EXPECT_EQ(p.step, 100);
  EXPECT_EQ(sources(p, 0, 0), (std::vector<std::pair<Tier, int64_t>>{{Tier::durable, 100}}));
  EXPECT_EQ(p.timeline, std::vector<int64_t>{100});
  EXPECT_EQ(restore_step_dir(p), "/out/global_step100");
  // Files: the non-expert file, then every whole expert file at or before the target.
  ASSERT_EQ(p.file_sizes.size(), 5u);
  EXPECT_EQ(p.file_sizes[0], (std::pair<std::string, uint64_t>{"mp_rank_00_model_states.pt", 100}));
  EXPECT_EQ(p.file_sizes[4].second, 13u);
}

TEST(PecRestorePlan, FileSizesCountCutFilesWholeAndSkipFragments) {
  Manifest m = manifest(100, Tier::durable, kAll);
  m.non_expert[0].cut = pec::CutList{5000, {{0, 8}}};
  m.experts[0].files[0].ranges = std::vector<pec::ByteRange>{{"data/0", 0, 8}};  // a fragment, not a file
  RestorePlan p = plan_restore(catalog({{0, m}}), request());
  ASSERT_EQ(p.file_sizes.size(), 4u);
  EXPECT_EQ(p.file_sizes[0].second, 5000u);
  const json j = restore_plan_to_json(p);
  EXPECT_EQ(j["non_expert"]["files"][0]["size"], 5000);
  EXPECT_EQ(j["non_expert"]["files"][0]["expert_ranges"], 1);
  EXPECT_EQ(j["experts"][0]["files"][0]["fragments"], 1);
}

TEST(PecRestorePlan, JsonNamesTheSourcesObjectsAndReportInputs) {
  Manifest fast = manifest(200, Tier::fast, {{0, 0}});
  RestorePlan p = plan_restore(catalog({{0, manifest(100, Tier::durable, kAll)}, {1, fast}}), request());
  json j = restore_plan_to_json(p);
  EXPECT_EQ(j["step"], 200);
  EXPECT_EQ(j["step_dir"], "/out/global_step200");
  EXPECT_EQ(j["pointers"], json::array({"latest"}));
  EXPECT_EQ(j["non_expert"]["tier"], "fast");
  EXPECT_EQ(j["non_expert"]["store"], "/s/fast");
  EXPECT_EQ(j["non_expert"]["files"][0]["objects"], json::array({oid(200)}));
  ASSERT_EQ(j["experts"].size(), 4u);
  EXPECT_EQ(j["experts"][0]["tier"], "fast");
  EXPECT_EQ(j["experts"][0]["step"], 200);
  EXPECT_EQ(j["experts"][0]["files"][0]["objects"], json::array({oid(201)}));
  EXPECT_EQ(j["experts"][0]["fallbacks"][0]["step"], 100);
  EXPECT_EQ(j["experts"][3]["tier"], "durable");
  EXPECT_EQ(j["experts"][3]["step"], 100);
  EXPECT_EQ(j["experts"][3]["fallbacks"], json::array());
  EXPECT_EQ(j["objects_read"], 5);            // one non-expert file and four expert files, one chunk each
  EXPECT_EQ(j["bytes_read"], 100 + 10 + 11 + 12 + 13);
  EXPECT_EQ(j["timeline"], json::array({100, 200}));
  EXPECT_EQ(j["tokens"]["from"], "none");
  EXPECT_EQ(j["report_k"]["tier"], "fast");   // no durable manifest at step 200
  EXPECT_EQ(j["stores"][1]["steps"], json::array({200}));
  // Token counts: the store's own, else --tokens, else none.
  p.request.tokens = "t.json";
  EXPECT_EQ(restore_plan_to_json(p)["tokens"]["from"], "file");
  p.catalog.copies[p.base].manifest.tokens_known = true;
  EXPECT_EQ(restore_plan_to_json(p)["tokens"]["from"], "store");
}

}  // namespace restore_plan_test
