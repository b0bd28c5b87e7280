// DeepSpeed native-MoE version lines: lookup by line or release, detection from file facts, and
// Megatron's nested module helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "formats/deepspeed/module_tree.h"
#include "formats/deepspeed/version_line.h"

namespace deepspeed_version_line_test {

using namespace ucpkit;
using ucpkit::pickle::Value;

TEST(VersionLine, ReleasesMapToTheirLine) {
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.14.0"), "0.14");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.16.5"), "0.14");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("v0.17.0"), "0.14");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.17.1"), "0.17.1");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.19.1"), "0.17.1");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.19.2"), "0.19.2");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.19.4"), "0.19.3");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.19.6+abc"), "0.19.5");
  EXPECT_EQ(formats::deepspeed::moe_line_of_release("0.20.0"), "0.19.5");
  EXPECT_FALSE(formats::deepspeed::moe_line_of_release("0.13.9"));
  EXPECT_FALSE(formats::deepspeed::moe_line_of_release("latest"));
  EXPECT_EQ(formats::deepspeed::moe_version_line("0.16.5").name, "0.14");
  EXPECT_THROW(formats::deepspeed::moe_version_line("0.12"), UsageError);
}

TEST(VersionLine, TableFollowsTheSaveCode) {
  const auto& l14 = formats::deepspeed::moe_version_line("0.14");
  EXPECT_TRUE(l14.module_metadata);
  EXPECT_FALSE(l14.compact_copies);
  EXPECT_EQ(l14.mp_rank_keys.back(), "num_experts");
  EXPECT_EQ(l14.mp_rank_keys.size(), 11u);
  EXPECT_EQ(formats::deepspeed::moe_version_line("0.19.2").mp_rank_keys.back(), "ds_autoep_layers");
  const auto& l193 = formats::deepspeed::moe_version_line("0.19.3");
  EXPECT_TRUE(l193.common_state && l193.expp_files);
  EXPECT_EQ(l193.mp_rank_keys[3], "param_shapes");
  EXPECT_FALSE(formats::deepspeed::moe_version_line("0.19.5").expp_files);
  // v0.19.5 engine.py:238-246 via _common_checkpoint_state (:4840-4862): after mp_world_size.
  const auto& k195 = formats::deepspeed::moe_version_line("0.19.5").mp_rank_keys;
  const auto mp = std::find(k195.begin(), k195.end(), "mp_world_size");
  ASSERT_NE(mp, k195.end());
  EXPECT_EQ(*(mp + 1), "checkpoint_parallel_dimensions");
  EXPECT_EQ(std::count(l193.mp_rank_keys.begin(), l193.mp_rank_keys.end(), "checkpoint_parallel_dimensions"), 0);
}

TEST(VersionLine, DetectedFromWhatTheReaderFound) {
  formats::deepspeed::MoeFileFacts f;
  f.expp_files = true;
  f.module_metadata = true;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.14");
  f.module_metadata = false;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.17.1");
  f.autoep_key = true;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.19.2");
  f.param_shapes = true;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.19.3");
  f.expp_files = false;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.19.5");
  f.ds_version = "0.19.4";  // a release string wins when the keys agree with it
  f.expp_files = false;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.19.3");
  f.ds_version.clear();  // checkpoint_parallel_dimensions is written from v0.19.5 on
  f.expp_files = true;
  f.parallel_dims = true;
  EXPECT_EQ(formats::deepspeed::detect_moe_version_line(f).name, "0.19.5");
}

TEST(ModuleTree, NestedNamesReplacementAndMetadata) {
  auto t = [] { return Value::of_tensor(Tensor(Storage::zeros(DType::Float32, 2), 0, {2}, {1})); };
  auto we = Value::dict(true);
  we->set_item("weight", t());
  auto emb = Value::dict();
  emb->set_item("word_embeddings", we);
  auto enc = Value::dict(true);
  enc->set_item("layers.0.input_layernorm.weight", t());
  auto lm = Value::dict();
  lm->set_item("embedding", emb);
  lm->set_item("encoder", enc);
  auto module = Value::dict();
  module->set_item("language_model", lm);
  ASSERT_TRUE(formats::deepspeed::module_is_nested(module));
  auto names = formats::deepspeed::module_tensors(module);
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].first, "language_model.embedding.word_embeddings.weight");
  EXPECT_EQ(names[1].first, "language_model.encoder.layers.0.input_layernorm.weight");
  auto fresh = t();
  formats::deepspeed::replace_module_tensors(module, [&](const std::string& n, const pickle::ValuePtr&) {
    return n == names[1].first ? fresh : nullptr;
  });
  EXPECT_EQ(enc->get("layers.0.input_layernorm.weight"), fresh);
  EXPECT_FALSE(formats::deepspeed::module_has_metadata(module));
  formats::deepspeed::add_module_metadata(module, {{"language_model.encoder", {"layers.1.mlp.deepspeed_moe.experts.deepspeed_experts.0.w"}}});
  ASSERT_TRUE(formats::deepspeed::module_has_metadata(module));
  auto meta = enc->dict_state->get("_metadata");
  ASSERT_TRUE(meta);
  EXPECT_TRUE(meta->contains(""));
  EXPECT_TRUE(meta->contains("layers.0.input_layernorm"));
  EXPECT_TRUE(meta->contains("layers.1.mlp.deepspeed_moe.experts.deepspeed_experts.0"));
  EXPECT_FALSE(emb->dict_state);  // Megatron's own levels are plain dicts without _metadata
  formats::deepspeed::drop_module_metadata(module);
  EXPECT_FALSE(formats::deepspeed::module_has_metadata(module));
}

}  // namespace deepspeed_version_line_test
