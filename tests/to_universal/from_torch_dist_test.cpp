// lib/to_universal/from_torch_dist: a real Megatron-Core torch_dist save (tests/formats/megatron_core/data/
// gpt_tp2_pp2, saved by Megatron-LM in both optimizer forms from the same state) planned and read as universal
// fp32 states, checked against the plain tensors Megatron's own reader returned (<form>.truth/tensors.safetensors):
// fully_reshardable read per layer, dp_reshardable unflattened from its buckets, and the union's side files.
#include "to_universal/from_torch_dist.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/dcp/range_reader.h"
#include "formats/megatron_core/mcore_data.h"
#include "io/safetensors_file.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/files.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace from_torch_dist_test {
namespace {

using ucpkit::testing::error_of;

const std::string kGpt = ucpkit::testing::kMcoreData + "/gpt_tp2_pp2";
const std::string kFully = kGpt + "/fully_reshardable";
const std::string kDp = kGpt + "/dp_reshardable";

using ucpkit::testing::TempDir;

// Megatron's plain tensors of the fully_reshardable save (one process's load_plain_tensors).
// (of `model`'s save, default gpt_tp2_pp2).
const std::map<std::string, SafetensorsTensor>& truth(const std::string& model = kGpt) {
  static std::map<std::string, std::map<std::string, SafetensorsTensor>> cache;
  auto& t = cache[model];
  if (t.empty())
    t = parse_safetensors(ucpkit::testing::file_bytes(model + "/fully_reshardable.truth/tensors.safetensors"), model);
  return t;
}

// The truth's float32 elements of universal parameter `name`'s state (Megatron's name: param, exp_avg,
// exp_avg_sq): decoder.layers.<L>.<rest> is row L of the stacked decoder.layers.<rest>.
std::vector<float> truth_state(const std::string& name, const std::string& stored, const std::string& model = kGpt) {
  static const std::regex layer(R"(decoder\.layers\.(\d+)\.(.*))");
  std::smatch m;
  std::string key = "optimizer.state." + stored + "." + name;
  int64_t row = -1;
  if (std::regex_match(name, m, layer)) {
    key = "optimizer.state." + stored + ".decoder.layers." + m[2].str();
    row = std::stoll(m[1].str());
  }
  const SafetensorsTensor& t = truth(model).at(key);
  EXPECT_EQ(t.dtype, "F32") << key;
  std::vector<float> all(t.bytes.size() / 4);
  std::memcpy(all.data(), t.bytes.data(), t.bytes.size());
  if (row < 0) return all;
  const size_t per = all.size() / t.shape[0];
  return {all.begin() + row * per, all.begin() + (row + 1) * per};
}

std::vector<float> floats(const Tensor& t) { return t.contiguous().to_vector<float>(); }

const std::map<std::string, std::string> kStored = {
    {"fp32", "param"}, {"exp_avg", "exp_avg"}, {"exp_avg_sq", "exp_avg_sq"}};

TEST(TorchDistPlan, OneParameterPerLayerWithGlobalShapesAndTheSourceLayout) {
  TorchDistStates td(kFully);
  const TorchDistPlan& plan = td.plan();
  EXPECT_EQ(plan.optimizer_format, "fully_reshardable");
  // 10 tensors per layer x 2 layers, the final norm, the embedding and the output layer.
  ASSERT_EQ(plan.params.size(), 23u);
  std::map<std::string, const TorchDistParam*> by;
  for (const auto& p : plan.params) by[p.name] = &p;
  ASSERT_TRUE(by.count("decoder.layers.1.self_attention.linear_qkv.weight"));
  const TorchDistParam& qkv = *by["decoder.layers.1.self_attention.linear_qkv.weight"];
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{48, 16}));
  EXPECT_EQ(qkv.dtype, DType::BFloat16);
  EXPECT_EQ(qkv.bytes, 48u * 16 * 4 * 3);  // fp32 param, exp_avg, exp_avg_sq
  ASSERT_TRUE(by.count("embedding.word_embeddings.weight"));
  EXPECT_EQ(by["embedding.word_embeddings.weight"]->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_TRUE(by.count("decoder.final_layernorm.weight"));
  EXPECT_EQ(plan.source.format, "torch_dist");
  EXPECT_EQ(plan.source.tp, 2);
  EXPECT_EQ(plan.source.pp, 2);
  const auto& facts = plan.source.facts.at("torch_dist");
  EXPECT_EQ(facts.at("optimizer_format"), "fully_reshardable");
  EXPECT_EQ(facts.at("layers"), 2);
  EXPECT_TRUE(facts.at("experts_per_layer").empty());
}

// The README of the data: moe_ep2 has layer 0 dense and layer 1 MoE with 4 experts; the Megatron-Core 0.16
// save keeps its common state in the legacy common.pt.
TEST(TorchDistPlan, ExpertsPerLayerAndLegacyCommonStateAreRecorded) {
  const auto moe =
      TorchDistStates(ucpkit::testing::kMcoreData + "/moe_ep2/dp_reshardable").plan().source.facts.at("torch_dist");
  EXPECT_EQ(moe.at("experts_per_layer"), nlohmann::json({{"1", 4}}));
  EXPECT_EQ(moe.at("experts"), 4);
  EXPECT_EQ(moe.at("legacy_common_pt"), false);
  const auto llama = TorchDistStates(ucpkit::testing::kMcoreData + "/llama_gqa_tp2_dp2_v016/dp_reshardable")
                         .plan()
                         .source.facts.at("torch_dist");
  EXPECT_EQ(llama.at("legacy_common_pt"), true);
  EXPECT_TRUE(llama.at("experts_per_layer").empty());
}

TEST(TorchDistStates, StatesAreTheThreeAdamStatesAndTheParamGroupsAreRead) {
  TorchDistStates td(kFully);
  EXPECT_TRUE(td.has_optimizer());
  EXPECT_EQ(td.states(), (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
  EXPECT_FALSE(td.groups().empty());
  EXPECT_NE(td.common(), nullptr);
}

TEST(TorchDistStates, FullyReshardableReadsEqualMegatronsTensors) {
  TorchDistStates td(kFully);
  for (size_t i = 0; i < td.plan().params.size(); ++i)
    for (const auto& [state, stored] : kStored) {
      const auto& p = td.plan().params[i];
      SCOPED_TRACE(p.name + " " + state);
      const Tensor t = td.read(i, state);
      EXPECT_EQ(t.dtype(), DType::Float32);
      EXPECT_EQ(t.shape(), p.shape);
      EXPECT_EQ(floats(t), truth_state(p.name, stored));
    }
}

// The same state saved as flat DP buckets: unflattened and its TP pieces joined, it is the tensor of the
// fully_reshardable save.
TEST(TorchDistStates, DpReshardableBucketsUnflattenToMegatronsTensors) {
  TorchDistStates td(kDp);
  EXPECT_EQ(td.plan().optimizer_format, "dp_reshardable");
  ASSERT_EQ(td.plan().params.size(), 23u);
  for (size_t i = 0; i < td.plan().params.size(); ++i)
    for (const auto& [state, stored] : kStored) {
      const auto& p = td.plan().params[i];
      SCOPED_TRACE(p.name + " " + state);
      const Tensor t = td.read(i, state);
      EXPECT_EQ(t.shape(), p.shape);
      EXPECT_EQ(floats(t), truth_state(p.name, stored));
    }
}

// GQA with TP 2 x DP 2 (each bucket split between the DP ranks), saved by Megatron-Core 0.16.
TEST(TorchDistStates, GqaDpReshardableBucketsSplitOverDpRanksUnflattenToMegatronsTensors) {
  const std::string llama = ucpkit::testing::kMcoreData + "/llama_gqa_tp2_dp2_v016";
  TorchDistStates td(llama + "/dp_reshardable");
  ASSERT_FALSE(td.plan().params.empty());
  for (size_t i = 0; i < td.plan().params.size(); ++i)
    for (const auto& [state, stored] : kStored) {
      const auto& p = td.plan().params[i];
      SCOPED_TRACE(p.name + " " + state);
      EXPECT_EQ(floats(td.read(i, state)), truth_state(p.name, stored, llama));
    }
}

// A Qwen2-MoE-shaped model trained by Megatron-LM (scripts/fixtures/mcore_trained_fixtures.sh): layer 0 dense,
// layer 1 MoE with a gated shared expert, fp32 at EP 2 x DP 2, dp_reshardable. Its fp32 master weights unflattened
// from the buckets equal the model weights Megatron's own reader returns (fp32 training: the same values). The
// shared expert's gate_weight, a parameter of SharedExpertMLP itself, comes before its linear_fc1 / linear_fc2 in
// the buckets (torch's named_parameters order); it was taken as the last, and the four tensors were read shifted.
TEST(TorchDistStates, GatedSharedExpertAndDenseLayerBucketsUnflattenToMegatronsWeights) {
  const std::string model = ucpkit::testing::kMcoreData + "/qwen2_moe_ep2_trained";
  const auto t = parse_safetensors(ucpkit::testing::file_bytes(model + "/dp_reshardable.truth/tensors.safetensors"), model);
  static const std::regex expert(R"((decoder\.layers\.\d+\.mlp\.experts\.experts\.)(\d+)\.(.*))");
  TorchDistStates td(model + "/dp_reshardable");
  size_t shared = 0;
  for (size_t i = 0; i < td.plan().params.size(); ++i) {
    const std::string& name = td.plan().params[i].name;
    SCOPED_TRACE(name);
    std::smatch m;
    std::vector<float> want;
    if (std::regex_match(name, m, expert)) {  // heterogeneous layers: one key per layer, the experts stacked
      const SafetensorsTensor& w = t.at(m[1].str() + m[3].str());
      const size_t per = w.bytes.size() / 4 / static_cast<size_t>(w.shape[0]), e = std::stoul(m[2].str());
      want.resize(per);
      std::memcpy(want.data(), w.bytes.data() + e * per * 4, per * 4);
    } else {
      const SafetensorsTensor& w = t.at(name);
      want.resize(w.bytes.size() / 4);
      std::memcpy(want.data(), w.bytes.data(), w.bytes.size());
    }
    EXPECT_EQ(floats(td.read(i, "fp32")), want);
    shared += name.find(".shared_experts.") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(shared, 3u);  // linear_fc1, linear_fc2, gate_weight
}

TEST(TorchDistStates, RangesReadTheSameElementsAndAreNullForBuckets) {
  TorchDistStates fully(kFully);
  size_t ranged = 0;
  for (size_t i = 0; i < fully.plan().params.size(); ++i) {
    const auto& p = fully.plan().params[i];
    auto r = fully.range(i, "exp_avg");
    if (!r) continue;  // chunks spanning several layers: read() assembles them
    ++ranged;
    EXPECT_EQ(r->shape(), p.shape);
    std::vector<float> got(r->numel());
    r->copy(0, r->numel(), reinterpret_cast<uint8_t*>(got.data()));
    EXPECT_EQ(got, truth_state(p.name, "exp_avg")) << p.name;
  }
  EXPECT_GT(ranged, 0u);
  TorchDistStates dp(kDp);
  EXPECT_EQ(dp.range(0, "fp32"), nullptr);
}

TEST(TorchDistEntry, NamesTheStateFilesInTheParametersFolder) {
  TorchDistParam p;
  p.name = "decoder.layers.0.mlp.linear_fc1.weight";
  p.shape = {64, 16};
  p.dtype = DType::BFloat16;
  const auto e = torch_dist_entry(p, {"fp32", "exp_avg"}, true);
  EXPECT_EQ(e.name, p.name);
  EXPECT_EQ(e.shape, p.shape);
  EXPECT_EQ(e.dtype, "bfloat16");
  EXPECT_EQ(e.tp_shapes, (std::vector<std::vector<int64_t>>{{64, 16}}));
  ASSERT_EQ(e.states.size(), 2u);
  EXPECT_EQ(e.states.at("fp32").file, "zero/decoder.layers.0.mlp.linear_fc1.weight/fp32.pt");
  EXPECT_EQ(e.states.at("exp_avg").file, "zero/decoder.layers.0.mlp.linear_fc1.weight/exp_avg.pt");
  EXPECT_TRUE(e.step);
  EXPECT_FALSE(torch_dist_entry(p, {"fp32"}, false).step);
}

TEST(TorchDistDryRunPlan, CountsEveryParameterWithItsThreeStatesAndStep) {
  for (const std::string& in : {kFully, kDp}) {
    const DcpPlan plan = dcp_plan_of_torch_dist(in);
    EXPECT_TRUE(plan.optimizer) << in;
    ASSERT_EQ(plan.params.size(), 23u) << in;
    for (const auto& p : plan.params) {
      EXPECT_EQ(p.states.size(), 3u) << p.name;
      EXPECT_EQ(p.step, "step") << p.name;
    }
    EXPECT_EQ(plan.source.format, "torch_dist");
  }
}

TEST(TorchDistStates, AMissingDataFileIsNamed) {
  TempDir d;
  fs::copy(kFully, d.path() / "ck", fs::copy_options::recursive);
  fs::remove(d.path() / "ck" / "__3_0.distcp");
  const auto what = error_of([&] {
    TorchDistStates td((d.path() / "ck").string());
    for (size_t i = 0; i < td.plan().params.size(); ++i) td.read(i, "fp32");
  });
  EXPECT_NE(what.find("__3_0.distcp"), std::string::npos) << what;
}

TEST(TorchDistUnion, WritesTheStatesAndTheMegatronSideFiles) {
  TempDir d;
  ConvertOptions o;
  o.sync = false;
  o.threads = 2;
  const fs::path out = d.path() / "u";
  const auto s = run_union_torch_dist(kDp, out.string(), o);
  EXPECT_EQ(s.params, 23u);
  for (const char* f : {kMcoreCommonStateFile, kMcoreObjectsFile, "zero/optimizer_state.pt", "manifest.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  const fs::path qkv = out / "zero" / "decoder.layers.1.self_attention.linear_qkv.weight";
  for (const auto& [state, stored] : kStored) {
    auto root = load_torch((qkv / (state + ".pt")).string());
    const Tensor t = root->is(pickle::Kind::Dict) ? root->at("param")->as_tensor() : root->as_tensor();
    EXPECT_EQ(floats(t), truth_state("decoder.layers.1.self_attention.linear_qkv.weight", stored)) << state;
  }
  // The ._extra_state objects of both layers' modules, by their keys.
  auto objects = load_torch((out / kMcoreObjectsFile).string());
  EXPECT_NE(objects->get("decoder.layers.mlp.linear_fc1._extra_state/shard_0_2"), nullptr);
  EXPECT_EQ(objects->get("common_state/shard_0_1"), nullptr);
}

TEST(TorchDistUnion, PatternsAreRefusedAndNothingIsWritten) {
  TempDir d;
  ConvertOptions o;
  o.patterns_file = "p.json";
  const auto what = error_of([&] { run_union_torch_dist(kFully, (d.path() / "u").string(), o); });
  EXPECT_NE(what.find("no TP slices to join"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(d.path() / "u"));
}

}  // namespace
}  // namespace from_torch_dist_test
}  // namespace ucpkit::to_universal
