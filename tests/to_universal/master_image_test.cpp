// lib/to_universal/master_image: the module weights of a fixture's model files checked against fp32 masters.
// The masters are the ground truth's universal fp32 states (the generator's, written with torch), so the true
// image passes; a master changed by hand must be refused naming the model file, the element, the stored
// value and the rounded one (round to nearest even, computed here by hand).
#include "to_universal/master_image.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/paths.h"
#include "to_universal/extract.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace master_image_test {
namespace {

using ucpkit::testing::error_of;

// The truth's fp32 master of `name` (the whole parameter; a replicated one is every TP rank's slice).
std::vector<float> truth_fp32(const std::string& fixture, const std::string& name) {
  auto root = load_torch(kFx + "/" + fixture + "/truth/universal/zero/" + name + "/fp32.pt");
  const Tensor t = root->is(pickle::Kind::Dict) ? root->at("param")->as_tensor() : root->as_tensor();
  return t.contiguous().to_vector<float>();
}

const ParamPlan& param(const ExtractPlan& plan, const std::string& name) {
  for (const auto& p : plan.params)
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

std::span<const uint8_t> bytes_of(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4};
}

// bfloat16 bits of `f` by round to nearest even (finite values).
uint16_t bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

std::string hex4(uint16_t v) {
  char s[8];
  std::snprintf(s, sizeof s, "0x%04x", v);
  return s;
}

constexpr const char* kDp16 = "gpt_dp16_padding_ranks";  // tp 1, pp 1, bf16 module weights
constexpr const char* kLn = "language_model.encoder.layers.0.input_layernorm.weight";
constexpr const char* kQkv = "language_model.encoder.layers.0.self_attention.query_key_value.weight";

TEST(MasterImage, TheTrueMastersPass) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + kDp16, {});
  const MasterImage image(plan, true);
  EXPECT_FALSE(image.empty());
  for (const char* name : {kLn, kQkv}) {
    const auto fp32 = truth_fp32(kDp16, name);
    EXPECT_NO_THROW(image.check(param(plan, name), bytes_of(fp32), {0}, plan.files)) << name;
    EXPECT_NO_THROW(image.check_run(param(plan, name), 0, 3, fp32.data() + 3, 5, plan.files)) << name;
  }
}

TEST(MasterImage, AMasterOfAnotherRunIsRefusedNamingTheFilesAndValues) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + kDp16, {});
  const MasterImage image(plan, true);
  auto fp32 = truth_fp32(kDp16, kQkv);
  const uint16_t stored = bf16_bits(fp32[7]);
  fp32[7] = fp32[7] * 2 + 1;
  const auto what = error_of([&] { image.check(param(plan, kQkv), bytes_of(fp32), {0}, plan.files); });
  EXPECT_NE(what.find("mp_rank_00_model_states.pt"), std::string::npos) << what;
  EXPECT_NE(what.find(std::string("module weight ") + kQkv + " element 7 is bfloat16 " + hex4(stored)),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("rounds to " + hex4(bf16_bits(fp32[7]))), std::string::npos) << what;
  EXPECT_NE(what.find("optim_states.pt"), std::string::npos) << what;
  EXPECT_NE(what.find("different runs"), std::string::npos) << what;
}

TEST(MasterImage, ARunNamesTheElementOfTheWholeSlice) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + kDp16, {});
  const MasterImage image(plan, true);
  auto fp32 = truth_fp32(kDp16, kQkv);
  fp32[12] = fp32[12] * 2 + 1;
  // Elements [10, 20): the difference is element 12 of the slice.
  const auto what = error_of([&] { image.check_run(param(plan, kQkv), 0, 10, fp32.data() + 10, 10, plan.files); });
  EXPECT_NE(what.find("element 12 is bfloat16"), std::string::npos) << what;
  // A run past the weight's end is not compared.
  EXPECT_NO_THROW(image.check_run(param(plan, kQkv), 0, fp32.size() - 2, fp32.data(), 5, plan.files));
}

TEST(MasterImage, NoVerifyAndZero3LeaveItEmpty) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + kDp16, {});
  const MasterImage off(plan, false);
  EXPECT_TRUE(off.empty());
  auto fp32 = truth_fp32(kDp16, kQkv);
  fp32[0] += 1000;
  EXPECT_NO_THROW(off.check(param(plan, kQkv), bytes_of(fp32), {0}, plan.files));
  EXPECT_TRUE(MasterImage(plan_checkpoint(kFx + "/gpt_zero3_dp40_subgroups", {}), true).empty());
}

// TP 2, fp16 module weights: a replicated parameter's two TP slices are the same master back to back.
TEST(MasterImage, EveryTpRanksSliceIsCheckedAgainstItsOwnModelFile) {
  const std::string fx = "gpt_untied_swiglu_tp2_dp3_zero2_fp16";
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + fx, {});
  const MasterImage image(plan, true);
  const std::string name = "language_model.encoder.layers.0.input_layernorm.weight";
  const auto one = truth_fp32(fx, name);
  std::vector<float> both = one;
  both.insert(both.end(), one.begin(), one.end());
  const size_t half = one.size() * 4;
  EXPECT_NO_THROW(image.check(param(plan, name), bytes_of(both), {0, half}, plan.files));
  both[one.size() + 1] = both[one.size() + 1] * 2 + 1;  // element 1 of TP rank 1's slice
  const auto what = error_of([&] { image.check(param(plan, name), bytes_of(both), {0, half}, plan.files); });
  EXPECT_NE(what.find("mp_rank_01_model_states.pt"), std::string::npos) << what;
  EXPECT_NE(what.find("element 1 is float16"), std::string::npos) << what;
}

// A PipelineModule: the weights are in its layer_NN-model_TT files under local names.
TEST(MasterImage, PipelineLayerFilesAreChecked) {
  const std::string fx = "gpt_tp2_pp2_dp3";
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + fx, {});
  const MasterImage image(plan, true);
  ASSERT_FALSE(image.empty());
  const std::string name = "4.input_layernorm.weight";
  const auto one = truth_fp32(fx, name);
  std::vector<float> both = one;
  both.insert(both.end(), one.begin(), one.end());
  EXPECT_NO_THROW(image.check(param(plan, name), bytes_of(both), {0, one.size() * 4}, plan.files));
  const uint16_t stored = bf16_bits(both[2]);
  both[2] = both[2] * 2 + 1;
  const auto what = error_of([&] { image.check(param(plan, name), bytes_of(both), {0, one.size() * 4}, plan.files); });
  EXPECT_NE(what.find("layer_04-model_00-model_states.pt"), std::string::npos) << what;
  EXPECT_NE(what.find("element 2 is bfloat16 " + hex4(stored)), std::string::npos) << what;
}

TEST(MasterImage, ExpertsAndUnknownParametersAreNotChecked) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/dsmoe_dp4_ep2", {});
  const MasterImage image(plan, true);
  std::vector<float> junk(1 << 12, 1e6f);
  for (const auto& p : plan.params)
    if (p.expert >= 0) EXPECT_NO_THROW(image.check(p, bytes_of(junk), {0}, plan.files)) << p.name;
  ParamPlan other;
  other.name = "no.such.param";
  other.tp_shapes = {{4}};
  EXPECT_NO_THROW(image.check(other, bytes_of(junk), {0}, plan.files));
}

}  // namespace
}  // namespace master_image_test
}  // namespace ucpkit::to_universal
