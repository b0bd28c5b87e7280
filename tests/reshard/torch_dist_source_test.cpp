// lib/reshard/torch_dist_source: a Megatron-Core torch_dist save read as a virtual universal checkpoint in
// Megatron-DeepSpeed names through --template. The save is made here from the GPT fixture's DeepSpeed
// source (ucp-load --format torch_dist: Megatron-Core names, stacked layers, the vocabulary padded to
// 104 rows), the template is ucp-union of that source; every atomic element read back is checked against
// dsgen's ground truth (QKV regrouped, padded rows cut), with the one-pass source's refusals.
#include <gtest/gtest.h>

#include <functional>

#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "core/error.h"
#include "formats/detect.h"
#include "io/torch/torch_file.h"
#include "reshard/model_info.h"
#include "reshard/torch_dist_source.h"
#include "reshard/universal_fixture.h"
#include "support/errors.h"
#include "support/process.h"

namespace torch_dist_source_test {

using namespace ucpkit;
using namespace ucpkit::reshard;
namespace fs = std::filesystem;

namespace {

// The torch_dist save of the GPT source (TP 1 PP 1 DP 2, as the source), made once per process.
const std::string& torch_dist_save() {
  static const std::string dir = [] {
    const std::string d = ucpkit::testing::scratch_dir("torch_dist_source") + "/td";
    std::string out;
    if (ucpkit::testing::run_command(std::string(UCPKIT_BIN_DIR) + "/ucp-load -q --format torch_dist --input " +
                                         ucpkit::testing::quote(loadtest::gpt_case().src.string()) + " --output " +
                                         ucpkit::testing::quote(d),
                                     &out) != 0)
      ADD_FAILURE() << "ucp-load --format torch_dist failed: " << out;
    return d;
  }();
  return dir;
}

struct Opened {
  std::shared_ptr<TorchDistInput> in;
  ModelInfo model;
  Opened() {
    in = open_torch_dist_input(torch_dist_save(), loadtest::gpt_case().universal.string(), "");
    model = model_info_from(torch_dist_meta(*in));
  }
};

std::vector<float> truth(const std::string& name, const std::string& state) {
  auto root = load_torch((loadtest::gpt_case().truth / "universal" / "zero" / name / (state + ".pt")).string());
  return root->at("param")->as_tensor().contiguous().to_vector<float>();
}

std::string error_of(const std::function<void()>& f) { return ucpkit::testing::error_of(f, "(no error)"); }

}  // namespace

TEST(TorchDistSource, OnlyTorchDistFoldersAreReadThroughATemplate) {
  EXPECT_TRUE(takes_template_input({std::string(formats::kTorchDist), ""}));
  EXPECT_FALSE(takes_template_input({std::string(formats::kDeepSpeed), ""}));
  EXPECT_FALSE(takes_template_input({std::string(formats::kUniversal), ""}));
  EXPECT_FALSE(static_cast<bool>(template_reader({std::string(formats::kDcp), ""})));
  EXPECT_TRUE(formats::detect(torch_dist_save()).is(formats::kTorchDist));
}

TEST(TorchDistSource, AFolderThatIsNoTorchDistSaveIsRefused) {
  EXPECT_THROW(
      open_torch_dist_input(loadtest::gpt_case().universal.string(), loadtest::gpt_case().universal.string(), ""),
      std::exception);
}

TEST(TorchDistSource, MetaIsTheTemplatesNamesAndShapes) {
  const Opened o;
  const UniversalMeta meta = torch_dist_meta(*o.in);
  EXPECT_NE(meta.manifest_path.find("(torch_dist, Megatron-DeepSpeed names from --template"), std::string::npos)
      << meta.manifest_path;
  nlohmann::json truth_meta;
  std::ifstream(loadtest::gpt_case().truth / "meta.json") >> truth_meta;
  std::map<std::string, std::vector<int64_t>> want;
  for (const auto& p : truth_meta["params"]) want[p["name"]] = p["shape"].get<std::vector<int64_t>>();
  ASSERT_EQ(meta.manifest.params.size(), want.size());
  for (const auto& e : meta.manifest.params) {
    ASSERT_TRUE(want.count(e.name)) << e.name;
    EXPECT_EQ(e.shape, want[e.name]) << e.name;  // word embeddings: 100 rows, the save's 104 cut
  }
  EXPECT_FALSE(meta.model_files.empty());  // the template's
  for (const auto& f : meta.model_files) EXPECT_EQ(f.rfind(loadtest::gpt_case().universal.string(), 0), 0u) << f;
}

TEST(TorchDistSource, EveryElementIsTheTruth) {
  const Opened o;
  TorchDistSource source(*o.in, o.model);
  EXPECT_FALSE(source.wants_crc());
  for (size_t i = 0; i < o.model.params.size(); ++i)
    for (size_t s = 0; s < o.model.states.size(); ++s) {
      const auto& p = o.model.params[i];
      SCOPED_TRACE(p.name + " " + o.model.states[s]);
      // In three parts, as the exchange asks for units.
      std::vector<float> got(static_cast<size_t>(p.stored_numel));
      const int64_t n = p.stored_numel, a = n / 3, b = 2 * n / 3;
      source.read(static_cast<int>(i), static_cast<int>(s), b, n - b, got.data() + b);
      source.read(static_cast<int>(i), static_cast<int>(s), 0, a, got.data());
      source.read(static_cast<int>(i), static_cast<int>(s), a, b - a, got.data() + a);
      ASSERT_EQ(got, truth(p.name, o.model.states[s]));
    }
}

TEST(TorchDistSource, AnElementAskedTwiceIsRefused) {
  const Opened o;
  TorchDistSource source(*o.in, o.model);
  std::vector<float> buf(64);
  source.read(0, 0, 0, 32, buf.data());
  const std::string msg = error_of([&] { source.read(0, 0, 16, 32, buf.data()); });
  EXPECT_NE(msg.find("asked twice"), std::string::npos) << msg;
  EXPECT_NE(msg.find(o.model.params[0].name), std::string::npos) << msg;
  EXPECT_NO_THROW(source.read(0, 0, 32, 32, buf.data()));
}

TEST(TorchDistSource, ElementsOutsideTheTensorAreRefused) {
  const Opened o;
  TorchDistSource source(*o.in, o.model);
  const int64_t n = o.model.params[1].stored_numel;
  std::vector<float> buf(4);
  const std::string msg = error_of([&] { source.read(1, 0, n - 2, 4, buf.data()); });
  EXPECT_NE(msg.find("asked, it has " + std::to_string(n)), std::string::npos) << msg;
}

TEST(TorchDistSource, AParameterTheSaveDoesNotHoldIsRefused) {
  const Opened o;
  ModelInfo m = o.model;
  m.params[0].name = "language_model.no_such.weight";
  const std::string msg = error_of([&] { TorchDistSource source(*o.in, m); });
  EXPECT_NE(msg.find("no value for parameter 'language_model.no_such.weight'"), std::string::npos) << msg;
}

TEST(TorchDistSource, StepIsTheSavesStepAFreshValueEachCall) {
  const Opened o;
  TorchDistSource source(*o.in, o.model);
  ASSERT_TRUE(o.model.params[0].step);
  const pickle::ValuePtr a = source.step(0), b = source.step(0);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a.get(), b.get());
  const double v = a->kind == pickle::Kind::Tensor ? a->tensor->contiguous().to_vector<float>().at(0) : a->as_float();
  EXPECT_EQ(v, 100.0);  // dsgen's step
}

}  // namespace torch_dist_source_test
