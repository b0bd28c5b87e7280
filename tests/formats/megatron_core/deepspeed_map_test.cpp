// formats/megatron_core/deepspeed_map: the QKV row order and the map files' name matching.
#include "formats/megatron_core/deepspeed_map.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace megatron_core_deepspeed_map_test {

namespace mc = ucpkit::formats::megatron_core;
using ucpkit::Tensor;

namespace {

// Rows labelled by (kind, head, row-in-head) as 100 * kind + 10 * head + row: kind 0 q, 1 k, 2 v.
std::vector<float> labels_split(int heads, int groups, int hd) {
  std::vector<float> v;
  for (int k = 0; k < 3; ++k)
    for (int h = 0; h < (k == 0 ? heads : groups); ++h)
      for (int r = 0; r < hd; ++r) v.push_back(100.f * k + 10.f * h + r);
  return v;
}

TEST(DeepSpeedMapQkv, GroupedOrderIsMegatronCoresPerGroupQueriesThenKeyThenValue) {
  const int heads = 4, groups = 2, hd = 2;
  const Tensor t = Tensor::from_vector(ucpkit::DType::Float32, {(heads + 2 * groups) * hd}, labels_split(heads, groups, hd));
  const auto g = mc::qkv_split_to_grouped(t, {heads, groups, hd}).to_vector<float>();
  // Megatron-Core (attention.py:1860-1900): group 0 = q heads 0,1, k head 0, v head 0; group 1 = q 2,3, k 1, v 1.
  const std::vector<float> want = {0, 1, 10, 11, 100, 101, 200, 201, 20, 21, 30, 31, 110, 111, 210, 211};
  EXPECT_EQ(g, want);
  const auto back = mc::qkv_grouped_to_split(mc::qkv_split_to_grouped(t, {heads, groups, hd}), {heads, groups, hd});
  EXPECT_EQ(back.to_vector<float>(), t.to_vector<float>());
  // MHA (groups = heads): per head q, k, v.
  EXPECT_THROW(mc::qkv_split_to_grouped(t, {heads, 3, hd}), ucpkit::Error);
}

TEST(DeepSpeedMapQkv, RowRunsMoveTheRowsQkvGroupedToSplitMoves) {
  // A weight [rows, 3] labelled by row, for GQA, MHA and MQA shapes: the row runs applied by hand give
  // qkv_grouped_to_split's tensor, and they tile the output in order.
  for (const mc::QkvShape s : {mc::QkvShape{4, 2, 2}, mc::QkvShape{3, 3, 1}, mc::QkvShape{8, 1, 3}}) {
    const int64_t rows = (s.heads + 2 * s.groups) * s.head_dim, cols = 3;
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v.push_back(static_cast<float>(r * 10 + c));
    const Tensor t = Tensor::from_vector(ucpkit::DType::Float32, {rows, cols}, v);
    const auto want = mc::qkv_grouped_to_split(t, s).to_vector<float>();
    std::vector<float> got(v.size(), -1.f);
    int64_t next = 0;
    for (const auto& run : mc::qkv_grouped_to_split_rows(2, rows, s)) {
      EXPECT_EQ(run.out, next);
      next += run.rows;
      for (int64_t r = 0; r < run.rows; ++r)
        for (int64_t c = 0; c < cols; ++c) got[(run.out + r) * cols + c] = v[(run.in + r) * cols + c];
    }
    EXPECT_EQ(next, rows);
    EXPECT_EQ(got, want);
  }
  EXPECT_THROW(mc::qkv_grouped_to_split_rows(2, 15, {4, 2, 2}), ucpkit::Error);
  EXPECT_THROW(mc::qkv_grouped_to_split_rows(0, 16, {4, 2, 2}), ucpkit::Error);
}

TEST(DeepSpeedMapNames, ShippedMapsNameGptModelAndPipelineSpellings) {
  const auto maps = mc::shipped_model_maps();
  ASSERT_EQ(maps.size(), 3u);
  const mc::ModelMap* gpt = nullptr;
  for (const auto& m : maps)
    if (m.family == "gpt") gpt = &m;
  ASSERT_NE(gpt, nullptr);
  const mc::PipeNumbering none;
  auto n = mc::to_megatron_core(*gpt, "language_model.encoder.layers.7.self_attention.dense.weight", none);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->name, "decoder.layers.7.self_attention.linear_proj.weight");
  EXPECT_EQ(n->layer, 7);
  mc::PipeNumbering pipe;
  pipe.first_block = 2;
  pipe.final_norm = 6;
  pipe.head = 7;
  n = mc::to_megatron_core(*gpt, "3.mlp.dense_h_to_4h.bias", pipe);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->name, "decoder.layers.1.mlp.linear_fc1.bias");
  n = mc::to_megatron_core(*gpt, "6.weight", pipe);
  ASSERT_TRUE(n);
  EXPECT_EQ(n->name, "decoder.final_layernorm.weight");
  EXPECT_FALSE(mc::to_megatron_core(*gpt, "5.weight", pipe));      // not the final norm's layer
  EXPECT_FALSE(mc::to_megatron_core(*gpt, "3.mlp.dense_h_to_4h.bias", none));  // pipeline names need the numbering
  EXPECT_FALSE(mc::to_megatron_core(*gpt, "language_model.encoder.layers.x.input_layernorm.weight", none));
}

TEST(DeepSpeedMapNames, BadMapFilesAreRefusedNamingTheKey) {
  auto bad = [](const char* text) { return nlohmann::json::parse(text); };
  EXPECT_THROW(mc::ModelMap::from_json(bad(R"({"format": "x"})"), "m.json"), ucpkit::Error);
  try {
    mc::ModelMap::from_json(bad(R"({"format": "ucpkit-megatron-core-map", "family": "f", "params": [
        {"megatron_deepspeed": "a.{Q}.b", "megatron_core": "c"}]})"),
                            "m.json");
    FAIL();
  } catch (const ucpkit::Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: params[0].megatron_deepspeed: placeholder '{Q}'"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(mc::ModelMap::from_json(bad(R"({"format": "ucpkit-megatron-core-map", "family": "f", "params": [
        {"megatron_deepspeed": "a.{L}", "megatron_core": "c.{B}"}]})"),
                                       "m.json"),
               ucpkit::Error);
  EXPECT_THROW(mc::ModelMap::from_json(bad(R"({"format": "ucpkit-megatron-core-map", "family": "f", "params": [
        {"megatron_deepspeed": "a", "megatron_core": "c", "layout": "transpose"}]})"),
                                       "m.json"),
               ucpkit::Error);
}

}  // namespace

}  // namespace megatron_core_deepspeed_map_test
