// PipelineModule layout facts (lib/formats/deepspeed/pipeline): layer numbering read from layer files
// for both GPTModelPipe numberings, the pattern-file fallback, names, mp_world_size.
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "formats/deepspeed/pipeline.h"

namespace deepspeed_pipeline_test {

using namespace ucpkit;
using namespace ucpkit::formats::deepspeed;

namespace {

// Layer files of a 4-block GPT as GPTModelPipe saves them: `first` is the first block's index,
// `gap` the function specs between the last block and the final norm (dsgen PIPE_NUMBERING).
std::map<int, std::vector<std::string>> gpt_files(int first, int gap, std::set<int>& numbered, std::set<int>& blocks) {
  std::map<int, std::vector<std::string>> files;
  files[1] = {"word_embeddings.weight", "position_embeddings.weight"};
  for (int i = 0; i < 4; ++i) {
    files[first + i] = {"input_layernorm.weight", "self_attention.query_key_value.weight"};
    numbered.insert(first + i);
    blocks.insert(first + i);
  }
  const int norm = first + 4 + gap;
  files[norm] = {"weight", "bias"};
  numbered.insert(norm);
  files[norm + 1] = {"word_embeddings.weight", "position_embeddings.weight"};
  return files;
}

}  // namespace

TEST(PipelineNumbering, MegatronDeepSpeedAndBigScienceFromLayerFiles) {
  const std::set<std::string> tied = {"word_embeddings.weight", "position_embeddings.weight"};
  {  // deepspeedai/Megatron-DeepSpeed gpt_model.py: embedding 1, blocks 2..5, norm 6, head 7
    std::set<int> numbered, blocks;
    auto files = gpt_files(2, 0, numbered, blocks);
    const auto n = detect_pipeline_numbering(files, numbered, blocks, tied);
    EXPECT_EQ(n.embedding, 1);
    EXPECT_EQ(n.first_block, 2);
    EXPECT_EQ(n.last_block, 5);
    EXPECT_EQ(n.final_norm, 6);
    EXPECT_EQ(n.tied_head, 7);
    EXPECT_EQ(pipeline_numbering_from_json(to_json(n), "x"), n);
  }
  {  // BigScience: transpose specs around the blocks: blocks 3..6, norm 8, head 9
    std::set<int> numbered, blocks;
    auto files = gpt_files(3, 1, numbered, blocks);
    const auto n = detect_pipeline_numbering(files, numbered, blocks, tied);
    EXPECT_EQ(n.embedding, 1);
    EXPECT_EQ(n.first_block, 3);
    EXPECT_EQ(n.final_norm, 8);
    EXPECT_EQ(n.tied_head, 9);
  }
  {  // a tied module in no file: an error, not a guess
    std::set<int> numbered, blocks;
    auto files = gpt_files(2, 0, numbered, blocks);
    files.erase(1);
    files.erase(7);
    EXPECT_THROW(detect_pipeline_numbering(files, numbered, blocks, tied), Error);
  }
}

TEST(PipelineNumbering, ShippedPatternFileFallbackFollowsMegatronDeepSpeed) {
  std::ifstream in(std::string(UCPKIT_SOURCE_DIR) + "/patterns/megatron-gpt-pipe-tied.json");
  nlohmann::json j;
  in >> j;
  const auto n = pipeline_numbering_from_patterns(j, {2, 3, 4, 5, 6}, {2, 3, 4, 5});
  EXPECT_EQ(n.origin, "patterns");
  EXPECT_EQ(n.embedding, 1);
  EXPECT_EQ(n.tied_head, 7);
  EXPECT_EQ(n.final_norm, 6);
  EXPECT_EQ(pipeline_numbering_from_patterns(nlohmann::json::object(), {2}, {2}).embedding, -1);
  EXPECT_THROW(pipeline_numbering_from_json({{"embedding", 1}}, "manifest.json"), Error);
}

TEST(PipelineNames, SplitAndWorldSize) {
  EXPECT_EQ(split_pipeline_name("12.self_attention.dense.weight"), std::make_pair(12, std::string("self_attention.dense.weight")));
  EXPECT_EQ(split_pipeline_name("tied_modules.embed.word_embeddings.weight"),
            std::make_pair(-1, std::string("word_embeddings.weight")));
  EXPECT_EQ(split_pipeline_name("language_model.embedding.word_embeddings.weight").first, -2);
  EXPECT_TRUE(is_block_local("self_attention.dense.weight"));
  EXPECT_FALSE(is_block_local("weight"));
  EXPECT_EQ(mp_world_size(2, 2, true), 4);   // PipelineEngine: the grid's model group is PP x TP
  EXPECT_EQ(mp_world_size(2, 1, false), 2);  // Megatron's mpu: TP
  EXPECT_TRUE(kTiedModulesFirst);
}

}  // namespace deepspeed_pipeline_test
