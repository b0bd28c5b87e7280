// Pattern sets without I/O: Python re.match semantics, the join-rule order, one pattern per
// category, sub-param specs, JSON round trip, plans' size-balanced split.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tensor.h"
#include "patterns/pattern_set.h"
#include "to_universal/plan.h"
#include "to_universal/union_fragments.h"

namespace pattern_set_test {

using namespace ucpkit;
using namespace ucpkit::patterns;

namespace {

PatternSet gpt_set() {
  return PatternSet::from_json(nlohmann::json::parse(R"({
    "original_vocab_size": 10,
    "vocabulary_parameter_patterns": ["tied_modules.embed.word_embeddings.weight", "\\d+.lm_head.weight"],
    "pipeline_replicated_parameter_patterns": ["tied_modules.embed.word_embeddings.weight"],
    "tp_replicated_parameter_patterns": ["\\d+.input_layernorm.weight"],
    "parameter_to_average_patterns": ["\\d+.weight"],
    "parameter_with_row_parallelism_patterns": ["\\d+.self_attention.dense.weight"],
    "parameter_with_2_sub_params_cat_dim_0": ["\\d+.mlp.dense_h_to_4h.weight"],
    "parameter_with_sub_params": [{"patterns": ["\\d+.self_attention.query_key_value.weight"],
                                   "shape": [[8, 4, 4], -1], "partition_dim": 0}]
  })"), "test");
}

}  // namespace

TEST(Pattern, PythonReMatchSemantics) {
  Pattern p(R"(\d+.weight)");
  EXPECT_TRUE(p.matches("12.weight"));
  EXPECT_TRUE(p.matches("12.weights_extra"));  // re.match is not anchored at the end
  EXPECT_TRUE(p.matches("12xweight"));         // dots are unescaped: any character
  EXPECT_FALSE(p.matches("a12.weight"));       // anchored at the start
  EXPECT_FALSE(p.matches("3.input_layernorm.weight"));
  EXPECT_THROW(Pattern("(unclosed"), Error);
}

TEST(Classify, RuleOrder) {
  auto s = gpt_set();
  EXPECT_EQ(classify(s, "3.input_layernorm.weight").kind, JoinKind::Replicate);
  EXPECT_EQ(classify(s, "9.weight").kind, JoinKind::Average);
  auto r = classify(s, "3.mlp.dense_h_to_4h.weight");
  EXPECT_EQ(r.kind, JoinKind::TwoSubParams);
  r = classify(s, "3.self_attention.query_key_value.weight");
  EXPECT_EQ(r.kind, JoinKind::SubParams);
  EXPECT_EQ(r.sub_param_index, 0);
  r = classify(s, "3.self_attention.dense.weight");
  EXPECT_EQ(r.kind, JoinKind::Cat);
  EXPECT_EQ(r.cat_dim, 1);
  r = classify(s, "tied_modules.embed.word_embeddings.weight");
  EXPECT_EQ(r.kind, JoinKind::Cat);
  EXPECT_EQ(r.cat_dim, 0);
  EXPECT_TRUE(r.vocab);
  EXPECT_TRUE(r.pipeline_replicated);
  EXPECT_EQ(classify(s, "3.mlp.dense_4h_to_h.bias").kind, JoinKind::Cat);
}

TEST(Classify, TwoPatternsOfOneCategoryIsAnError) {
  auto s = PatternSet::from_json(
      nlohmann::json::parse(R"({"parameter_to_average_patterns": ["\\d+.weight", "1.*"]})"), "test");
  EXPECT_THROW(classify(s, "12.weight"), Error);
  EXPECT_NO_THROW(classify(s, "2.weight"));
}

TEST(PatternSet, JsonRoundTripAndSources) {
  auto s = gpt_set();
  auto again = PatternSet::from_json(s.to_json(), "again");
  EXPECT_EQ(again.to_json(), s.to_json());
  EXPECT_EQ(*again.original_vocab_size, 10);
  ASSERT_EQ(again.sub_params.size(), 1u);
  EXPECT_EQ(again.sub_params[0].sub_sizes, (std::vector<int64_t>{8, 4, 4}));
  auto src = s.all_sources();  // pipeline-replicated patterns are not checked for use
  EXPECT_EQ(std::count(src.begin(), src.end(), "tied_modules.embed.word_embeddings.weight"), 1);
  EXPECT_THROW(PatternSet::from_json(nlohmann::json::parse(R"({"parameter_to_average_patterns": "x"})"), "t"), Error);
}

TEST(Union, GqaSubParamsUneven) {
  // Q of 8 rows, K and V of 4 rows, tp = 2: rank r holds Q[r*4:(r+1)*4], K[r*2:..], V[r*2:..].
  auto s = gpt_set();
  auto rule = classify(s, "3.self_attention.query_key_value.weight");
  std::vector<float> full(16 * 2);
  for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>(i);
  auto rows = [&](std::vector<std::pair<int, int>> ranges) {
    std::vector<float> v;
    for (auto [a, b] : ranges) v.insert(v.end(), full.begin() + a * 2, full.begin() + b * 2);
    return Tensor::from_vector<float>(DType::Float32, {static_cast<int64_t>(v.size() / 2), 2}, v);
  };
  auto t0 = rows({{0, 4}, {8, 10}, {12, 14}});
  auto t1 = rows({{4, 8}, {10, 12}, {14, 16}});
  auto joined = to_universal::union_fragments("qkv", {t0, t1}, rule, s);
  EXPECT_EQ(joined.shape(), (std::vector<int64_t>{16, 2}));
  EXPECT_EQ(joined.to_vector<float>(), full);
}

TEST(Union, TwoSubParamsAverageReplicateAndVocab) {
  auto s = gpt_set();
  auto t = [](std::vector<float> v, std::vector<int64_t> shape) { return Tensor::from_vector<float>(DType::Float32, shape, v); };
  // SwiGLU: each rank holds [gate_r; up_r].
  auto j = to_universal::union_fragments("h", {t({1, 2, 5, 6}, {4}), t({3, 4, 7, 8}, {4})},
                                classify(s, "3.mlp.dense_h_to_4h.weight"), s);
  EXPECT_EQ(j.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}));
  j = to_universal::union_fragments("a", {t({1, 2}, {2}), t({2, 5}, {2})}, classify(s, "9.weight"), s);
  EXPECT_EQ(j.to_vector<float>(), (std::vector<float>{1.5f, 3.5f}));
  auto rep = classify(s, "3.input_layernorm.weight");
  EXPECT_NO_THROW(to_universal::union_fragments("r", {t({1, 2}, {2}), t({1, 2}, {2})}, rep, s));
  EXPECT_THROW(to_universal::union_fragments("r", {t({1, 2}, {2}), t({1, 2.001f}, {2})}, rep, s), Error);
  to_universal::UnionOptions tol;
  tol.tolerance = 0.01;
  EXPECT_NO_THROW(to_universal::union_fragments("r", {t({1, 2}, {2}), t({1, 2.001f}, {2})}, rep, s, tol));
  auto v = to_universal::strip_padding("e", t({1, 2, 3, 4, 5, 6}, {3, 2}), 2);
  EXPECT_EQ(v.shape(), (std::vector<int64_t>{2, 2}));
  EXPECT_THROW(to_universal::strip_padding("e", t({1, 2}, {1, 2}), 2), Error);
}

TEST(Union, ShapeMismatchNamesParameter) {
  auto s = gpt_set();
  auto rule = classify(s, "3.self_attention.dense.weight");  // cat dim 1
  auto a = Tensor::zeros(DType::Float32, {4, 2}), b = Tensor::zeros(DType::Float32, {2, 4});
  try {
    to_universal::union_fragments("3.self_attention.dense.weight", {a, b}, rule, s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3.self_attention.dense.weight: shape mismatch"), std::string::npos);
  }
}

}  // namespace pattern_set_test
