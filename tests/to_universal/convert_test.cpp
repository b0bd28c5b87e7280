// lib/to_universal/convert: the drivers of ucp-extract and ucp-union run in-process on the DeepSpeed fixtures
// (their state files compared byte for byte with the ground truth the generator wrote with torch), and the
// helpers the header declares (summary JSON, written_crc32, convert_each, gathered_entries).
#include "to_universal/convert.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/pickle/value.h"
#include "io/tensor.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "to_universal/extract.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace convert_test {
namespace {

using pickle::Value;
using ucpkit::testing::error_of;
using ucpkit::testing::file_bytes;

// A fresh temporary folder, removed at the end of the test.
using ucpkit::testing::TempDir;

ConvertOptions quiet(std::vector<std::string>* warnings = nullptr) {
  ConvertOptions o;
  o.threads = 2;
  o.sync = false;
  if (warnings) o.reporter.warn = [warnings](const std::string& w) { warnings->push_back(w); };
  return o;
}

// The tensor a universal state file holds: "param" of the ZeRO-1/2 dict form, or the bare flat tensor.
Tensor state_tensor(const fs::path& file) {
  auto root = load_torch(file.string());
  return root->is(pickle::Kind::Dict) ? root->at("param")->as_tensor() : root->as_tensor();
}

std::vector<std::string> truth_params(const std::string& fixture) {
  std::ifstream in(fs::path(kFx) / fixture / "truth" / "meta.json");
  const auto meta = nlohmann::json::parse(in);
  std::vector<std::string> names;
  for (const auto& p : meta.at("params")) names.push_back(p.at("name"));
  return names;
}

// Every parameter's fp32, exp_avg and exp_avg_sq of `out` have the truth's dtype, shape and bytes.
void expect_states_match_truth(const fs::path& out, const std::string& fixture) {
  const fs::path truth = fs::path(kFx) / fixture / "truth" / "universal" / "zero";
  const auto names = truth_params(fixture);
  ASSERT_FALSE(names.empty());
  for (const auto& name : names)
    for (const std::string state : {"fp32", "exp_avg", "exp_avg_sq"}) {
      SCOPED_TRACE(name + "/" + state);
      ASSERT_TRUE(fs::exists(out / "zero" / name / (state + ".pt")));
      const Tensor ours = state_tensor(out / "zero" / name / (state + ".pt")).contiguous();
      const Tensor ref = state_tensor(truth / name / (state + ".pt")).contiguous();
      EXPECT_EQ(ours.dtype(), ref.dtype());
      EXPECT_EQ(ours.shape(), ref.shape());
      const auto a = ours.contiguous_bytes(), b = ref.contiguous_bytes();
      EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    }
}

TEST(ConvertSummary, JsonNamesEveryCounter) {
  RunSummary s;
  s.tool = "ucp-union";
  s.output = "/o";
  s.params = 3;
  s.files_written = 7;
  s.bytes_read = 100;
  s.bytes_written = 90;
  s.peak_rss_bytes = 5;
  s.seconds = 1.5;
  s.ranks = 2;
  s.threads = 4;
  s.buffers = 1;
  s.items = 2;
  s.not_carried = {"x"};
  EXPECT_EQ(s.to_json(), nlohmann::json::parse(R"({"tool":"ucp-union","output":"/o","params":3,"files_written":7,
      "bytes_read":100,"bytes_written":90,"seconds":1.5,"peak_rss_bytes":5,"mpi_ranks":2,"threads":4,
      "buffers":1,"items":2,"not_carried":["x"]})"));
}

TEST(ConvertSummary, UnionSummaryKeepsTheCountsOfOneProcess) {
  const auto s = union_summary("/out", 4, 3, 1000, 800, 9, std::chrono::steady_clock::now());
  EXPECT_EQ(s.tool, "ucp-union");
  EXPECT_EQ(s.output, "/out");
  EXPECT_EQ(s.params, 4u);
  EXPECT_EQ(s.threads, 3);
  EXPECT_EQ(s.ranks, 1);
  EXPECT_EQ(s.bytes_read, 1000u);
  EXPECT_EQ(s.bytes_written, 800u);
  EXPECT_EQ(s.files_written, 9u);
  EXPECT_GT(s.peak_rss_bytes, 0u);
  EXPECT_GE(s.seconds, 0);
}

// "123456789" is the CRC-32 check string: 0xCBF43926.
Tensor check_string_tensor(char first = '1') {
  std::vector<uint8_t> b = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  b[0] = first;
  return Tensor::from_bytes(DType::UInt8, {9}, b);
}

TEST(ConvertCrc, ComputedWhenThePathIsNoZip) {
  TempDir d;
  std::ofstream(d.path() / "plain") << "not a zip";
  EXPECT_EQ(written_crc32((d.path() / "plain").string(), check_string_tensor()), 0xCBF43926u);
  EXPECT_EQ(written_crc32((d.path() / "missing").string(), check_string_tensor()), 0xCBF43926u);
}

TEST(ConvertCrc, TakenFromTheOneDataRecordOfTheWrittenFile) {
  TempDir d;
  const auto path = (d.path() / "t.pt").string();
  save_torch_file(path, Value::of_tensor(check_string_tensor()));
  EXPECT_EQ(written_crc32(path, check_string_tensor()), 0xCBF43926u);
  // The record's CRC is used without reading the tensor: same size, other bytes still give the record's.
  EXPECT_EQ(written_crc32(path, check_string_tensor('0')), 0xCBF43926u);
  // A size that no record has: computed from the tensor ("12345678" is 0x9AE0DAAF).
  EXPECT_EQ(written_crc32(path, Tensor::from_bytes(DType::UInt8, {8}, {'1', '2', '3', '4', '5', '6', '7', '8'})),
            0x9AE0DAAFu);
}

TEST(ConvertCrc, ComputedWhenTheFileHasSeveralDataRecords) {
  TempDir d;
  const auto path = (d.path() / "two.pt").string();
  auto l = Value::list({Value::of_tensor(check_string_tensor('0')), Value::of_tensor(check_string_tensor('0'))});
  save_torch_file(path, l);
  EXPECT_EQ(written_crc32(path, check_string_tensor()), 0xCBF43926u);
}

TEST(ConvertEach, RunsEveryIndexOnceAndAdvancesTheBar) {
  struct Count : ProgressSink {
    std::atomic<uint64_t>* n;
    void advance(uint64_t k) override { *n += k; }
    void finish() override {}
  };
  std::atomic<uint64_t> advanced{0};
  Reporter r;
  r.progress = [&](const std::string&, uint64_t) {
    auto c = std::make_unique<Count>();
    c->n = &advanced;
    return c;
  };
  Reporter::Bar bar(r, "x", 5);
  std::mutex mu;
  std::multiset<size_t> seen;
  convert_each({7, 3, 11, 0, 5}, 3, bar, [&](size_t i) {
    std::lock_guard lock(mu);
    seen.insert(i);
  });
  EXPECT_EQ(seen, (std::multiset<size_t>{0, 3, 5, 7, 11}));
  EXPECT_EQ(advanced.load(), 5u);
}

TEST(ConvertEach, AnExceptionOfOneParameterReachesTheCaller) {
  Reporter r;
  Reporter::Bar bar(r, "x", 3);
  EXPECT_EQ(error_of([&] {
              convert_each({0, 1, 2}, 2, bar, [](size_t i) {
                if (i == 1) throw Error("param 1 failed");
              });
            }),
            "param 1 failed");
}

TEST(ConvertGather, EntriesArePlacedAtTheirIndex) {
  const std::string a =
      R"([[2, {"name": "c", "shape": [2], "states": {}}], [0, {"name": "a", "shape": [1, 3], "states": {}}]])";
  const std::string b = R"([[1, {"name": "b", "shape": [4], "states": {}}]])";
  const auto e = gathered_entries({a, b}, 3);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[0].name, "a");
  EXPECT_EQ(e[0].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(e[1].name, "b");
  EXPECT_EQ(e[2].name, "c");
  EXPECT_EQ(e[2].shape, (std::vector<int64_t>{2}));
}

TEST(ConvertUnion, OneStepWritesTheTruthsStatesAndTagsTheOutput) {
  TempDir d;
  const fs::path out = d.path() / "universal";
  const auto s = run_union(kFx + "/gpt_tp2_pp2_dp3", out.string(), quiet());
  EXPECT_EQ(s.tool, "ucp-union");
  EXPECT_EQ(s.params, truth_params("gpt_tp2_pp2_dp3").size());
  EXPECT_GT(s.bytes_read, 0u);
  EXPECT_GT(s.files_written, s.params);
  expect_states_match_truth(out, "gpt_tp2_pp2_dp3");
  EXPECT_TRUE(fs::exists(out / "zero" / "optimizer_state.pt"));
  EXPECT_TRUE(fs::exists(out / "manifest.json"));
  EXPECT_EQ(file_bytes((d.path() / "latest_universal").string()), "universal");
}

TEST(ConvertUnion, NoTagWhenTagLatestIsOff) {
  TempDir d;
  auto o = quiet();
  o.tag_latest = false;
  run_union(kFx + "/gpt_tp2_pp2_dp3", (d.path() / "u").string(), o);
  EXPECT_TRUE(fs::exists(d.path() / "u" / "manifest.json"));
  EXPECT_FALSE(fs::exists(d.path() / "latest_universal"));
}

TEST(ConvertUnion, Zero3FlatStatesMatchTheTruth) {
  TempDir d;
  run_union(kFx + "/gpt_zero3_dp40_subgroups", (d.path() / "u").string(), quiet());
  expect_states_match_truth(d.path() / "u", "gpt_zero3_dp40_subgroups");
}

TEST(ConvertUnion, NativeMoeIsNotTaggedUnlessAskedAndTheWarningSaysHowToResume) {
  TempDir d;
  std::vector<std::string> warnings;
  run_union(kFx + "/dsmoe_dp4_ep2", (d.path() / "u").string(), quiet(&warnings));
  expect_states_match_truth(d.path() / "u", "dsmoe_dp4_ep2");
  EXPECT_FALSE(fs::exists(d.path() / "latest_universal"));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("native-MoE"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("--dp 4 --ep 2"), std::string::npos) << warnings[0];
  auto o = quiet();
  o.tag_native_moe = true;
  run_union(kFx + "/dsmoe_dp4_ep2", (d.path() / "v").string(), o);
  EXPECT_EQ(file_bytes((d.path() / "latest_universal").string()), "v");
}

TEST(ConvertExtract, TwoStepsGiveTheTruthsStates) {
  TempDir d;
  const auto e = run_extract(kFx + "/gpt_tp2_pp2_dp3", (d.path() / "work").string(), quiet());
  EXPECT_EQ(e.tool, "ucp-extract");
  EXPECT_EQ(e.params, truth_params("gpt_tp2_pp2_dp3").size());
  EXPECT_TRUE(fs::exists(d.path() / "work" / "plan.json"));
  EXPECT_TRUE(fs::is_directory(d.path() / "work" / "fragments"));
  const auto u = run_union((d.path() / "work").string(), (d.path() / "u").string(), quiet());
  EXPECT_EQ(u.params, e.params);
  expect_states_match_truth(d.path() / "u", "gpt_tp2_pp2_dp3");
}

// One fragment file per (parameter, TP rank, partition): its fp32 runs, in partition order, are the truth's
// master; each holds every state and the step.
TEST(ConvertExtract, WorkFolderFragmentsJoinIntoTheTruthsMasters) {
  TempDir d;
  const std::string fx = "gpt_dp16_padding_ranks";
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + fx, {});
  const auto stats = write_work_folder(plan, (d.path() / "w").string(), 2, false);
  uint64_t fragments = 0;
  for (const auto& p : plan.params) fragments += p.fragments[0].size();
  EXPECT_EQ(stats.fragments, fragments);
  EXPECT_EQ(stats.files, fragments + 3);  // the model file, optimizer_state.pt, plan.json
  const std::string name = "language_model.encoder.layers.0.self_attention.dense.weight";
  const ParamPlan* p = nullptr;
  for (const auto& q : plan.params)
    if (q.name == name) p = &q;
  ASSERT_NE(p, nullptr);
  std::vector<float> joined;
  for (const auto& f : p->fragments[0]) {
    const fs::path file = d.path() / "w" / "fragments" / name / ("tp0.part" + std::to_string(f.part) + ".pt");
    auto root = load_torch(file.string());
    for (const char* state : {"fp32", "exp_avg", "exp_avg_sq"})
      EXPECT_EQ(root->at(state)->as_tensor().numel(), f.numel) << file << " " << state;
    EXPECT_EQ(root->at("step")->as_int(), 100);
    const auto v = root->at("fp32")->as_tensor().contiguous().to_vector<float>();
    joined.insert(joined.end(), v.begin(), v.end());
  }
  EXPECT_EQ(joined, state_tensor(fs::path(kFx) / fx / "truth/universal/zero" / name / "fp32.pt")
                        .contiguous()
                        .to_vector<float>());
  // The folder is not replaced unless asked.
  EXPECT_NE(error_of([&] { write_work_folder(plan, (d.path() / "w").string(), 2, false); }).find("exists"),
            std::string::npos);
}

TEST(ConvertExtract, RefusesWhatIsNoDeepSpeedCheckpoint) {
  TempDir d;
  fs::create_directories(d.path() / "empty");
  auto what = error_of([&] { run_extract((d.path() / "empty").string(), (d.path() / "w").string(), quiet()); });
  EXPECT_NE(what.find("not a checkpoint ucpkit reads"), std::string::npos) << what;
  // A format with a one-step union (Megatron-Core torch_dist) is sent to ucp-union.
  const std::string mcore = std::string(UCPKIT_SOURCE_DIR) +
                            "/tests/formats/megatron_core/data/gpt_tp2_pp2/fully_reshardable";
  what = error_of([&] { run_extract(mcore, (d.path() / "w").string(), quiet()); });
  EXPECT_NE(what.find("ucp-union converts it in one step"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(d.path() / "w"));
}

TEST(ConvertUnion, PatternsForAWorkFolderAreRefused) {
  TempDir d;
  run_extract(kFx + "/gpt_tp2_pp2_dp3", (d.path() / "work").string(), quiet());
  auto o = quiet();
  o.patterns_file = "/nonexistent/patterns.json";
  const auto what = error_of([&] { run_union((d.path() / "work").string(), (d.path() / "u").string(), o); });
  EXPECT_NE(what.find("whose patterns were fixed when it was extracted"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(d.path() / "u"));
}

TEST(ConvertUnion, UnusedPatternIsRefusedUnlessAllowed) {
  TempDir d;
  auto o = quiet();
  o.patterns_file = kFx + "/unused.patterns.json";
  const std::string in = kFx + "/gpt_no_uc_info";
  const auto what = error_of([&] { run_union(in, (d.path() / "u").string(), o); });
  EXPECT_NE(what.find("unused pattern 'no_such_param'"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(d.path() / "u"));
  EXPECT_NE(error_of([&] { run_extract(in, (d.path() / "w").string(), o); }).find("unused pattern"), std::string::npos);
  o.allow_unused_patterns = true;
  EXPECT_GT(run_union(in, (d.path() / "u").string(), o).params, 0u);
}

TEST(ConvertUnion, AnExistingOutputIsReplacedOnlyWithOverwrite) {
  TempDir d;
  const std::string in = kFx + "/gpt_tp2_pp2_dp3", out = (d.path() / "u").string();
  run_union(in, out, quiet());
  std::ofstream(d.path() / "u" / "stale") << "x";
  const auto what = error_of([&] { run_union(in, out, quiet()); });
  EXPECT_NE(what.find("overwrite"), std::string::npos) << what;
  EXPECT_TRUE(fs::exists(d.path() / "u" / "stale"));
  auto o = quiet();
  o.overwrite = true;
  run_union(in, out, o);
  EXPECT_FALSE(fs::exists(d.path() / "u" / "stale"));
  expect_states_match_truth(d.path() / "u", "gpt_tp2_pp2_dp3");
}

}  // namespace
}  // namespace convert_test
}  // namespace ucpkit::to_universal
