// lib/formats/deepspeed/gpt_pipe: GPTModelPipe's layout for a Llama-style model (names in named_parameters order,
// each layer file's keys, the numbering, the padded vocabulary, the TP patterns) and a fresh run's model file, without
// I/O. Laid out at TP 2 x PP 2 and exported back in tests/frameworks/hf_import_test.sh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/deepspeed/gpt_pipe.h"
#include "formats/deepspeed/model_states.h"

namespace ucpkit::formats::deepspeed {
namespace deepspeed_gpt_pipe_test {
namespace {

GptPipeModel model(bool tied) {
  GptPipeModel m;
  m.hidden = 16, m.ffn = 24, m.layers = 3, m.heads = 4, m.kv_heads = 2, m.head_dim = 4, m.max_positions = 32;
  m.vocab = 130, m.tied = tied;
  return m;
}

TEST(GptPipe, UntiedLayersAreNumberedAsGptModelPipesSpecs) {
  const auto l = gpt_pipe_layout(model(false));
  ASSERT_EQ(l.params.size(), 1u + 3 * 6 + 2);
  EXPECT_EQ(l.params.front().first, "1.word_embeddings.weight");
  EXPECT_EQ(l.params[2].first, "2.self_attention.query_key_value.weight");
  EXPECT_EQ(l.params[2].second, (std::vector<int64_t>{16 + 2 * 8, 16}));
  EXPECT_EQ(l.params[5].second, (std::vector<int64_t>{48, 16}));  // SwiGLU [W; V]
  EXPECT_EQ(l.params[l.params.size() - 2].first, "5.weight");
  EXPECT_EQ(l.params.back().first, "6.lm_head.weight");
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
  EXPECT_TRUE(set.unused_sources({}).size() == set.all_sources().size());
}

TEST(GptPipe, TiedEmbeddingIsATiedModuleWhoseHeadIsTheLastLayerFile) {
  const auto l = gpt_pipe_layout(model(true));
  EXPECT_EQ(l.params.front().first, "tied_modules.embed.word_embeddings.weight");
  EXPECT_EQ(l.params.back().first, "5.weight");
  EXPECT_EQ(l.layer_keys.at(6), std::vector<std::string>{"word_embeddings.weight"});
  EXPECT_EQ(l.numbering.embedding, 1);
  EXPECT_EQ(l.numbering.tied_head, 6);
  EXPECT_TRUE(patterns::classify(l.checkpoint_patterns, "tied_modules.embed.word_embeddings.weight").pipeline_replicated);
}

TEST(GptPipe, AFreshModelFileHasNoModuleTwoGroupsAndItsPatterns) {
  const auto m = model(false);
  const auto l = gpt_pipe_layout(m);
  const auto ms = read_rank_model_states(fresh_gpt_pipe_model_states(m, l, pickle::Value::none(), "0.19.8"), "mp_rank_00");
  EXPECT_TRUE(ms.get("module")->is_none());
  ASSERT_TRUE(ms.param_shapes);
  EXPECT_EQ(ms.param_shapes->at(0).front().first, "1.word_embeddings.weight");
  EXPECT_EQ(ms.param_shapes->at(1).front().first, "2.input_layernorm.weight");
  EXPECT_EQ(ms.param_shapes->at(0).size() + ms.param_shapes->at(1).size(), l.params.size());
  const auto info = universal_checkpoint_info(ms);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->get("padded_vocab_size")->i, 256);
  EXPECT_EQ(ms.get("iteration")->i, 0);
  EXPECT_EQ(*ms.ds_version, "0.19.8");
}

}  // namespace
}  // namespace deepspeed_gpt_pipe_test
}  // namespace ucpkit::formats::deepspeed
