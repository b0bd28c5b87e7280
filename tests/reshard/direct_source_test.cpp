// lib/reshard/direct_source in isolation: a native DeepSpeed checkpoint (tests/reshard/fixtures.py's dsgen
// sources) read as a virtual universal checkpoint. The truth is dsgen's own universal tensors (src/truth):
// every atomic element read from the shards (TP 1: identity; TP 2: column / row pieces, joined norms,
// vocabulary padding cut), the byte runs that file_runs() names read back from the shard files, the
// manifest direct_meta() gives, the checksums compared with ucp-union's manifest, and the refusals.
#include <gtest/gtest.h>

#include <functional>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>

#include <nlohmann/json.hpp>

#include "core/crc32.h"
#include "core/error.h"
#include "formats/detect.h"
#include "formats/universal/manifest.h"
#include "io/torch/torch_file.h"
#include "reshard/direct_source.h"
#include "reshard/model_info.h"
#include "reshard/universal_fixture.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/process.h"

namespace direct_source_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

const fs::path kFx = UCPKIT_FIXTURES_DIR;

// One source read directly: its plan, meta, model and source (kept alive together: the source refers to them).
struct Direct {
  fs::path src;
  nlohmann::json meta;  // src/truth/meta.json
  to_universal::ExtractPlan plan;
  ModelInfo model;
  std::unique_ptr<DirectSource> source;

  explicit Direct(const std::string& name) : src(kFx / name / "src") {
    std::ifstream in(src / "truth" / "meta.json");
    in >> meta;
    const formats::FolderKind kind = formats::detect(src.string());
    plan = direct_plan(src.string(), kind);
    model = model_info_from(direct_meta(plan));
    source = std::make_unique<DirectSource>(plan, model, true);
  }
  // dsgen's universal tensor of (name, state), row-major fp32.
  std::vector<float> truth(const std::string& name, const std::string& state, std::vector<int64_t>* shape = nullptr) {
    auto root = load_torch((src / "truth" / "universal" / "zero" / name / (state + ".pt")).string());
    const Tensor& t = root->at("param")->as_tensor();
    if (shape) *shape = t.shape();
    return t.contiguous().to_vector<float>();
  }
  std::vector<float> read_all(int param, int state) {
    std::vector<float> v(static_cast<size_t>(model.params[param].stored_numel));
    source->read(param, state, 0, static_cast<int64_t>(v.size()), v.data());
    return v;
  }
};

// TP 1 DP 2 GPT (every parameter read as one run of its shards).
Direct& gpt_tp1() {
  static Direct d("gpt_tp1dp2_to_tp2dp3");
  return d;
}
// TP 2 DP 2 GPT: column / row pieces, replicated parameters joined, vocabulary padding.
Direct& gpt_tp2() {
  static Direct d("gpt_tp2dp2_to_tp1dp4_z2_fp16");
  return d;
}

void expect_every_tensor_is_the_truth(Direct& d) {
  ASSERT_EQ(d.model.params.size(), d.meta["params"].size());
  for (size_t i = 0; i < d.model.params.size(); ++i)
    for (size_t s = 0; s < d.model.states.size(); ++s) {
      const std::string& name = d.model.params[i].name;
      SCOPED_TRACE(name + " " + d.model.states[s]);
      const std::vector<float> want = d.truth(name, d.model.states[s]);
      ASSERT_EQ(d.read_all(static_cast<int>(i), static_cast<int>(s)), want);
    }
}

std::string bytes_at(const std::string& path, uint64_t off, uint64_t n) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(off));
  std::string b(n, '\0');
  in.read(b.data(), static_cast<std::streamsize>(n));
  return b;
}

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

}  // namespace

TEST(DirectSource, DeepSpeedAndWorkFolderAreDirectInputsOthersAreNot) {
  EXPECT_TRUE(is_direct_input({std::string(formats::kDeepSpeed), ""}));
  EXPECT_TRUE(is_direct_input({std::string(formats::kWorkFolder), ""}));
  EXPECT_FALSE(is_direct_input({std::string(formats::kUniversal), ""}));
  EXPECT_FALSE(is_direct_input({std::string(formats::kTorchDist), ""}));
  EXPECT_FALSE(static_cast<bool>(direct_reader({"no-such-format", ""})));
}

TEST(DirectSource, NativeCheckpointDirFollowsLatest) {
  const fs::path src = kFx / "gpt_tp1dp2_to_tp2dp3" / "src";
  EXPECT_EQ(fs::path(native_checkpoint_dir(src.string(), {std::string(formats::kDeepSpeed), ""})).filename(),
            "global_step100");
}

TEST(DirectSource, NativeCheckpointDirRefusesAKindThatIsNoDirectInput) {
  const std::string msg = error_of([] {
    native_checkpoint_dir("/some/where", {std::string(formats::kUniversal), ""});
  });
  EXPECT_NE(msg.find("/some/where"), std::string::npos) << msg;
  EXPECT_NE(msg.find("universal folder"), std::string::npos) << msg;
}

TEST(DirectSource, NativeCheckpointDirRefusesAFolderWithoutShards) {
  const std::string dir = ucpkit::testing::scratch_dir("direct_source_empty");
  std::ofstream(fs::path(dir) / "latest") << "global_step7";
  fs::create_directories(fs::path(dir) / "global_step7");
  EXPECT_THROW(native_checkpoint_dir(dir, {std::string(formats::kDeepSpeed), ""}), Error);
}

TEST(DirectSource, MetaListsTheSourceParametersWithUniversalShapes) {
  Direct& d = gpt_tp2();
  const UniversalMeta meta = direct_meta(d.plan);
  ASSERT_EQ(meta.manifest.params.size(), d.meta["params"].size());
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& p : d.meta["params"]) want[p["name"]] = p["shape"].get<std::vector<int64_t>>();
  for (const auto& e : meta.manifest.params) {
    SCOPED_TRACE(e.name);
    ASSERT_TRUE(want.count(e.name));
    EXPECT_EQ(e.shape, want[e.name]);  // the vocabulary cut to 100 rows, TP pieces joined
    ASSERT_TRUE(e.states.count("fp32"));
    EXPECT_EQ(e.states.at("fp32").file, "zero/" + e.name + "/fp32.pt");
    EXPECT_FALSE(e.states.at("fp32").crc32);  // direct mode's manifest has no checksums
  }
  EXPECT_EQ(meta.optimizer_state_path, d.plan.optimizer_state_file);
  EXPECT_TRUE(meta.optimizer_state);
  EXPECT_EQ(d.model.states, (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
}

TEST(DirectSource, TpOneSourceReadsEveryTensorAsTheTruth) { expect_every_tensor_is_the_truth(gpt_tp1()); }

TEST(DirectSource, TpTwoSourceReadsEveryTensorAsTheTruth) { expect_every_tensor_is_the_truth(gpt_tp2()); }

TEST(DirectSource, PartialReadsAcrossTpPiecesMatchTheTruth) {
  Direct& d = gpt_tp2();
  // A row-split weight: every row's halves come from two TP ranks, so an odd window crosses pieces.
  const int p = d.model.param_index("language_model.encoder.layers.0.self_attention.dense.weight");
  ASSERT_GE(p, 0);
  const std::vector<float> want = d.truth(d.model.params[p].name, "exp_avg");
  const int64_t n = static_cast<int64_t>(want.size());
  for (const auto& [a, len] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {15, 3}, {17, 70}, {n - 5, 5}, {n, 0}}) {
    std::vector<float> got(static_cast<size_t>(len));
    d.source->read(p, 1, a, len, got.data());
    EXPECT_EQ(got, std::vector<float>(want.begin() + a, want.begin() + a + len)) << a << " +" << len;
  }
}

TEST(DirectSource, ReadOutsideTheTensorIsRefused) {
  Direct& d = gpt_tp1();
  const int64_t n = d.model.params[0].stored_numel;
  std::vector<float> buf(static_cast<size_t>(n) + 1);
  EXPECT_NE(error_of([&] { d.source->read(0, 0, 1, n, buf.data()); }).find("internal error"), std::string::npos);
  EXPECT_THROW(d.source->read(0, 0, -1, 1, buf.data()), Error);
}

TEST(DirectSource, FileRunsNameTheShardBytesOfTheElements) {
  Direct& d = gpt_tp2();
  for (size_t i = 0; i < d.model.params.size(); ++i) {
    const auto& mp = d.model.params[i];
    SCOPED_TRACE(mp.name);
    const std::vector<float> want = d.truth(mp.name, "exp_avg_sq");
    int64_t covered = 0;
    const bool mapped = d.source->file_runs(static_cast<int>(i), 2, 0, mp.stored_numel,
                                            [&](int file, uint64_t off, uint64_t nb, int64_t at) {
                                              EXPECT_EQ(at, covered);  // in element order, no gap
                                              const std::string b = bytes_at(d.plan.files.at(file), off, nb);
                                              EXPECT_EQ(0, std::memcmp(b.data(), want.data() + at, nb));
                                              covered += static_cast<int64_t>(nb / 4);
                                            });
    const std::string kind = [&] {
      for (const auto& p : d.meta["params"])
        if (p["name"] == mp.name) return p["kind"].get<std::string>();
      return std::string();
    }();
    // Replicated parameters are joined (read whole from every rank): no single byte range holds them.
    EXPECT_EQ(mapped, kind != "replicate" && kind != "average") << kind;
    if (mapped) EXPECT_EQ(covered, mp.stored_numel);
  }
}

TEST(DirectSource, SourceJsonCountsEveryTensorAndItsBytes) {
  Direct& d = gpt_tp1();
  const nlohmann::json j = d.source->source_json();
  EXPECT_EQ(j["source_files"].size(), d.plan.files.size());
  ASSERT_EQ(j["tensors"].size(), d.model.params.size() * d.model.states.size());
  uint64_t bytes = 0, runs = 0;
  for (const auto& t : j["tensors"]) {
    uint64_t tb = 0;
    for (const auto& r : t["runs"]) tb += r[2].get<uint64_t>();
    EXPECT_EQ(tb, t["elements"].get<uint64_t>() * 4) << t["param"];  // TP 1: every element read once
    EXPECT_FALSE(t["joined"].get<bool>());
    bytes += tb;
    runs += t["runs"].size();
  }
  EXPECT_EQ(j["totals"]["source_bytes_read"], bytes);
  EXPECT_EQ(j["totals"]["source_runs"], runs);
}

TEST(DirectSource, StepIsTheSourceStep) {
  Direct& d = gpt_tp1();
  const pickle::ValuePtr v = d.source->step(0);
  ASSERT_TRUE(v);
  // dsgen's layout: step 100, a plain number (step_tensor false).
  ASSERT_EQ(d.meta["step"], 100);
  EXPECT_EQ(v->as_float(), 100.0);
  EXPECT_NE(d.source->step(0).get(), v.get());  // a fresh value on every call
}

TEST(DirectSource, ChecksumsCompareWithTheUnionManifest) {
  Direct& d = gpt_tp1();
  const loadtest::UnionedCase& u = loadtest::gpt_case();  // ucp-union of the same source
  ASSERT_EQ(d.src, u.src);
  for (size_t i = 0; i < d.model.params.size(); ++i)
    for (size_t s = 0; s < d.model.states.size(); ++s) {
      const std::vector<float> v = d.truth(d.model.params[i].name, d.model.states[s]);
      const uint32_t crc = crc32_update(0, std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4));
      d.source->whole_crc(static_cast<int>(i), static_cast<int>(s), crc);
    }
  const nlohmann::json c = d.source->checksums();
  EXPECT_EQ(c.size(), d.model.params.size());
  EXPECT_EQ(c[d.model.params[0].name]["fp32"].get<std::string>().size(), 8u);
  EXPECT_EQ(d.source->compare_with(u.universal.string()), d.model.params.size() * d.model.states.size());

  // One wrong checksum: named with the parameter and state.
  d.source->whole_crc(0, 1, 0x12345678);
  const std::string msg = error_of([&] { d.source->compare_with(u.universal.string()); });
  EXPECT_NE(msg.find(d.model.params[0].name + " exp_avg: crc32 12345678"), std::string::npos) << msg;
}

TEST(DirectSource, CompareWithAManifestOfOtherParametersIsRefused) {
  Direct& d = gpt_tp2();
  const std::string dir = ucpkit::testing::scratch_dir("direct_source_manifest");
  formats::universal::UniversalManifest m = direct_meta(d.plan).manifest;
  m.params.pop_back();
  std::ofstream(fs::path(dir) / "manifest.json") << m.text();
  const std::string msg = error_of([&] { d.source->compare_with(dir); });
  EXPECT_NE(msg.find("parameters, the source has"), std::string::npos) << msg;
}

TEST(DirectSource, SourceCrcsCheckedOnTheBytesRead) {
  Direct d("gpt_tp1dp2_to_tp2dp3");  // own instance: keep_source_crcs changes its state
  d.source->keep_source_crcs(true);
  for (size_t i = 0; i < d.model.params.size(); ++i)
    for (size_t s = 0; s < d.model.states.size(); ++s) (void)d.read_all(static_cast<int>(i), static_cast<int>(s));
  uint64_t total = 0;
  for (const auto& f : d.plan.files) total += fs::file_size(f);
  const uint64_t read = d.source->check_source_crcs(d.plan.files, 2);
  EXPECT_LT(read, total);  // the tensor bytes already read were not read again
}

}  // namespace direct_source_test
