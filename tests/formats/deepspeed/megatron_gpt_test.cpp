// lib/formats/deepspeed/megatron_gpt: Megatron-DeepSpeed's GPT for a Llama-style model, without I/O: GPTModelPipe's
// layout when dense (names in named_parameters order, each layer file's keys, the numbering, the padded vocabulary,
// the TP patterns), GPTModel with native MoE otherwise (Megatron's nested module, the experts' groups), and a fresh
// run's model file. Laid out and exported back in tests/frameworks/hf_import_test.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/deepspeed/megatron_gpt.h"
#include "formats/deepspeed/model_states.h"
#include "formats/deepspeed/module_tree.h"

namespace ucpkit::formats::deepspeed {
namespace deepspeed_megatron_gpt_test {
namespace {

MegatronGpt model(bool tied, int64_t experts = 0) {
  MegatronGpt m;
  m.hidden = 16, m.ffn = 24, m.layers = 3, m.heads = 4, m.kv_heads = 2, m.head_dim = 4, m.max_positions = 32;
  m.vocab = 130, m.tied = tied, m.experts = experts, m.topk = 2;
  return m;
}

TEST(MegatronGpt, UntiedLayersAreNumberedAsGptModelPipesSpecs) {
  const auto l = megatron_gpt_layout(model(false));
  ASSERT_TRUE(l.pipeline);
  ASSERT_EQ(l.params.size(), 1u + 3 * 6 + 2);
  EXPECT_EQ(l.params.front().name, "1.word_embeddings.weight");
  EXPECT_EQ(l.params[2].name, "2.self_attention.query_key_value.weight");
  EXPECT_EQ(l.params[2].shape, (std::vector<int64_t>{16 + 2 * 8, 16}));
  EXPECT_EQ(l.params[5].shape, (std::vector<int64_t>{48, 16}));  // SwiGLU [W; V]
  EXPECT_EQ(l.params[l.params.size() - 2].name, "5.weight");
  EXPECT_EQ(l.params.back().name, "6.lm_head.weight");
  EXPECT_EQ(l.layer_keys.size(), 6u);
  EXPECT_EQ(l.numbering.first_block, 2);
  EXPECT_EQ(l.numbering.last_block, 4);
  EXPECT_EQ(l.numbering.final_norm, 5);
  EXPECT_EQ(l.numbering.embedding, -1);
  EXPECT_EQ(l.padded_vocab, 256);
  // The patterns join each parameter as the layer holds it: QKV as [Q; K; V] sub-parameters, rows, halves, copies.
  const auto& set = l.checkpoint_patterns;
  EXPECT_EQ(patterns::classify(set, "3.self_attention.query_key_value.weight").kind, patterns::JoinKind::SubParams);
  EXPECT_EQ(patterns::classify(set, "3.mlp.dense_h_to_4h.weight").kind, patterns::JoinKind::TwoSubParams);
  EXPECT_EQ(patterns::classify(set, "3.mlp.dense_4h_to_h.weight").cat_dim, 1);
  EXPECT_EQ(patterns::classify(set, "5.weight").kind, patterns::JoinKind::Replicate);
  EXPECT_TRUE(patterns::classify(set, "1.word_embeddings.weight").vocab);
  EXPECT_TRUE(patterns::classify(set, "6.lm_head.weight").vocab);
}

TEST(MegatronGpt, TiedEmbeddingIsATiedModuleWhoseHeadIsTheLastLayerFile) {
  const auto l = megatron_gpt_layout(model(true));
  EXPECT_EQ(l.params.front().name, "tied_modules.embed.word_embeddings.weight");
  EXPECT_EQ(l.params.back().name, "5.weight");
  EXPECT_EQ(l.layer_keys.at(6), std::vector<std::string>{"word_embeddings.weight"});
  EXPECT_EQ(l.numbering.embedding, 1);
  EXPECT_EQ(l.numbering.tied_head, 6);
  EXPECT_TRUE(patterns::classify(l.checkpoint_patterns, "tied_modules.embed.word_embeddings.weight").pipeline_replicated);
}

TEST(MegatronGpt, AFreshPipeModelFileHasNoModuleTwoGroupsAndItsPatterns) {
  const auto m = model(false);
  const auto l = megatron_gpt_layout(m);
  const auto ms = read_rank_model_states(fresh_megatron_gpt_model_states(m, l, pickle::Value::none(), "0.19.8"), "mp_rank_00");
  EXPECT_TRUE(ms.get("module")->is_none());
  ASSERT_TRUE(ms.param_shapes);
  ASSERT_EQ(ms.param_shapes->size(), 2u);
  EXPECT_EQ(ms.param_shapes->at(0).front().first, "1.word_embeddings.weight");
  EXPECT_EQ(ms.param_shapes->at(1).front().first, "2.input_layernorm.weight");
  EXPECT_EQ(ms.param_shapes->at(0).size() + ms.param_shapes->at(1).size(), l.params.size());
  const auto info = universal_checkpoint_info(ms);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->get("padded_vocab_size")->i, 256);
  EXPECT_EQ(ms.get("iteration")->i, 0);
  EXPECT_EQ(*ms.ds_version, "0.19.8");
}

TEST(MegatronGpt, NativeMoeIsGptModelWithExpertsAfterEachGateAndAThirdGroup) {
  const auto m = model(false, 4);
  const auto l = megatron_gpt_layout(m);
  ASSERT_FALSE(l.pipeline);
  EXPECT_EQ(l.num_experts, (std::vector<int>{4, 4, 4}));
  EXPECT_EQ(l.params.front().name, "language_model.embedding.word_embeddings.weight");
  EXPECT_EQ(l.params[5].name, "language_model.encoder.layers.0.mlp.deepspeed_moe.gate.wg.weight");
  EXPECT_EQ(l.params[5].shape, (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(l.params[6].name, "language_model.encoder.layers.0.mlp.deepspeed_moe.experts.deepspeed_experts.0.dense_h_to_4h.weight");
  EXPECT_EQ(l.params[6].layer, 0);
  EXPECT_EQ(l.params[6].expert, 0);
  EXPECT_EQ(l.params.back().name, "language_model.output_layer.weight");
  const auto& set = l.checkpoint_patterns;
  EXPECT_EQ(patterns::classify(set, "language_model.encoder.layers.2.mlp.deepspeed_moe.gate.wg.weight").kind,
            patterns::JoinKind::Replicate);
  EXPECT_EQ(patterns::classify(set, "language_model.encoder.layers.2.mlp.deepspeed_moe.experts.deepspeed_experts.3.dense_4h_to_h.weight").cat_dim, 1);
  EXPECT_TRUE(patterns::classify(set, "language_model.output_layer.weight").vocab);

  const auto ms = read_rank_model_states(fresh_megatron_gpt_model_states(m, l, pickle::Value::none(), "0.19.8"), "mp_rank_00");
  ASSERT_EQ(ms.param_shapes->size(), 3u);
  EXPECT_EQ(ms.param_shapes->at(2).size(), 3u * 4 * 2);  // the experts, DeepSpeed's MoE group
  // The module holds the dense parameters only, nested as Megatron saves them.
  EXPECT_EQ(ms.module.size(), l.params.size() - 3 * 4 * 2);
  const auto lm = ms.tree->get("language_model");
  ASSERT_TRUE(lm);
  EXPECT_TRUE(lm->get("embedding")->get("word_embeddings")->get("weight"));
  EXPECT_TRUE(lm->get("encoder")->get("layers.1.mlp.deepspeed_moe.gate.wg.weight"));
  EXPECT_TRUE(lm->get("output_layer")->get("weight"));
  EXPECT_EQ(num_experts(ms), (std::vector<int>{4, 4, 4}));
}

}  // namespace
}  // namespace deepspeed_megatron_gpt_test
}  // namespace ucpkit::formats::deepspeed
