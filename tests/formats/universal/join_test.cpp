// formats/universal/join: the join table. For every JoinKind, split() cuts back out of the joined
// tensor exactly the slice each TP rank gave to join(); worked examples follow DeepSpeed's
// merge_tp_slices (deepspeed/checkpoint/ds_to_universal.py at edaa72212, lines cited per test).
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "formats/universal/join.h"
#include "support/errors.h"

namespace universal_join_test {

using namespace ucpkit;
using formats::universal::join;
using formats::universal::record_join;
using formats::universal::split;
using formats::universal::split_dim;
using formats::universal::StateFile;
using patterns::JoinKind;
using patterns::ParamRule;
using patterns::PatternSet;

namespace {

Tensor f32(std::vector<int64_t> shape, std::vector<float> v) {
  return Tensor::from_vector<float>(DType::Float32, std::move(shape), v);
}

// Distinct values start, start + 1, ...
Tensor ramp(std::vector<int64_t> shape, float start) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<float>(i);
  return f32(std::move(shape), v);
}

std::vector<float> values(const Tensor& t) {
  const auto b = t.contiguous().contiguous_bytes();
  const float* p = reinterpret_cast<const float*>(b.data());
  return std::vector<float>(p, p + t.numel());
}

ParamRule rule(JoinKind k, int64_t cat_dim = 0) {
  ParamRule r;
  r.kind = k;
  r.cat_dim = cat_dim;
  if (k == JoinKind::SubParams) r.sub_param_index = 0;
  return r;
}

PatternSet with_sub_params(std::vector<int64_t> shape, std::vector<int64_t> sizes, bool as_tuple, int64_t dim) {
  PatternSet s;
  patterns::SubParamSpec spec;
  spec.patterns = {"qkv"};
  spec.shape = std::move(shape);
  spec.sub_sizes = std::move(sizes);
  spec.sizes_as_tuple = as_tuple;
  spec.partition_dim = dim;
  s.sub_params.push_back(spec);
  return s;
}

// The elements rank `t` holds, cut out of `joined` by split().
Tensor cut(const Tensor& joined, const ParamRule& r, const PatternSet& set, int tp, int t) {
  const auto s = split("p", joined.shape(), r, set, tp, t);
  std::vector<Tensor> parts;
  for (const auto& [start, n] : s.pieces) parts.push_back(joined.narrow(s.dim, start, n));
  Tensor c = cat(parts, s.dim);
  EXPECT_EQ(c.shape(), s.shape);
  return c;
}

}  // namespace

TEST(Join, SplitUndoesJoinForEveryKind) {
  struct Case {
    const char* what;
    ParamRule rule;
    PatternSet set;
    std::vector<int64_t> full;  // the universal shape
    int cut_dim;                // the dimension the ranks share out; -1: every rank gives the same tensor
  };
  const std::vector<Case> cases = {
      {"replicate", rule(JoinKind::Replicate), {}, {4, 3}, -1},
      {"average", rule(JoinKind::Average), {}, {4, 3}, -1},
      {"two sub-params", rule(JoinKind::TwoSubParams), {}, {12, 3}, 0},
      {"sub-params (sizes)", rule(JoinKind::SubParams), with_sub_params({24, -1}, {12, 6, 6}, true, 0), {24, 2}, 0},
      {"sub-params (count)", rule(JoinKind::SubParams), with_sub_params({-1, 2}, {-1, -1, -1}, false, 0), {18, 2}, 0},
      {"sub-params on dim 1", rule(JoinKind::SubParams), with_sub_params({2, 24}, {12, 12}, true, 1), {2, 24}, 1},
      {"cat dim 0", rule(JoinKind::Cat, 0), {}, {6, 5}, 0},
      {"cat dim 1", rule(JoinKind::Cat, 1), {}, {2, 6}, 1},
  };
  for (const auto& c : cases) {
    for (int tp : {1, 3}) {
      SCOPED_TRACE(std::string(c.what) + ", tp=" + std::to_string(tp));
      std::vector<int64_t> slice = c.full;
      if (c.cut_dim >= 0) slice[c.cut_dim] /= tp;
      std::vector<Tensor> slices;
      for (int t = 0; t < tp; ++t) slices.push_back(ramp(slice, c.cut_dim < 0 ? 0.5f : 100.f * t + 0.5f));
      const Tensor joined = join("p", slices, c.rule, c.set);
      EXPECT_EQ(joined.shape(), c.full);
      for (int t = 0; t < tp; ++t) EXPECT_EQ(values(cut(joined, c.rule, c.set, tp, t)), values(slices[t])) << "rank " << t;
    }
  }
}

TEST(Join, TwoSubParamsWorkedExample) {
  // ds_to_universal.py:348-353: each rank holds its half of both sub-params (torch.chunk(2) on dim 0);
  // the universal tensor is all first halves, then all second halves.
  const auto r = rule(JoinKind::TwoSubParams);
  const Tensor joined = join("h4h", {f32({4}, {0, 1, 4, 5}), f32({4}, {2, 3, 6, 7})}, r, {});
  EXPECT_EQ(values(joined), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  const auto s = split("h4h", {8}, r, {}, 2, 1);
  EXPECT_EQ(s.pieces, (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {6, 2}}));
}

TEST(Join, SubParamsWorkedExample) {
  // ds_to_universal.py:356-441: a fused QKV with GQA (q 4 rows, k 2, v 2) over TP 2: rank 0 holds
  // q0 q1 k0 v0, rank 1 q2 q3 k1 v1; each sub-parameter is joined on its own.
  const PatternSet set = with_sub_params({8, -1}, {4, 2, 2}, true, 0);
  const auto r = rule(JoinKind::SubParams);
  const Tensor joined = join("qkv", {f32({4, 1}, {0, 1, 4, 6}), f32({4, 1}, {2, 3, 5, 7})}, r, set);
  EXPECT_EQ(values(joined), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(split("qkv", {8, 1}, r, set, 2, 1).pieces,
            (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {5, 1}, {7, 1}}));
}

TEST(Join, CatAndAverageWorkedExamples) {
  // :442-447: row-parallel parameters join along dim 1.
  const Tensor rows = join("w", {f32({2, 2}, {0, 1, 4, 5}), f32({2, 2}, {2, 3, 6, 7})}, rule(JoinKind::Cat, 1), {});
  EXPECT_EQ(rows.shape(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(values(rows), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  // :345-347: sum(slices) / len(slices); sum() starts from the int 0, so -0.0 + -0.0 averages to +0.0.
  const Tensor avg = join("a", {f32({2}, {1, -0.0f}), f32({2}, {4, -0.0f})}, rule(JoinKind::Average), {});
  EXPECT_EQ(values(avg)[0], 2.5f);
  EXPECT_FALSE(std::signbit(values(avg)[1]));
}

TEST(Join, ReplicasMustAgree) {
  // :340-343 asserts every TP copy equals the first.
  const auto r = rule(JoinKind::Replicate);
  const std::string e =
      ucpkit::testing::error_of([&] { (void)join("ln", {f32({2}, {1, 2}), f32({2}, {1, 2.5f})}, r, {}); });
  EXPECT_NE(e.find("parameter ln"), std::string::npos) << e;
  EXPECT_NE(e.find("tp rank 1"), std::string::npos) << e;
  formats::universal::JoinOptions loose;
  loose.tolerance = 0.5;
  EXPECT_EQ(values(join("ln", {f32({2}, {1, 2}), f32({2}, {1, 2.5f})}, r, {}, loose)), (std::vector<float>{1, 2}));
}

TEST(Join, SplitDimPerKind) {
  const PatternSet set = with_sub_params({2, 24}, {12, 12}, true, 1);
  EXPECT_EQ(split_dim(rule(JoinKind::Replicate), set), -1);
  EXPECT_EQ(split_dim(rule(JoinKind::Average), set), -1);
  EXPECT_EQ(split_dim(rule(JoinKind::TwoSubParams), set), 0);
  EXPECT_EQ(split_dim(rule(JoinKind::SubParams), set), 1);
  EXPECT_EQ(split_dim(rule(JoinKind::Cat, 1), set), 1);
}

TEST(Join, StateFileKeysPerKind) {
  const PatternSet set = with_sub_params({8, -1}, {4, 2, 2}, true, 0);
  const auto keys = [&](const ParamRule& r) {
    StateFile f;
    record_join(r, set, f);
    return f;
  };
  auto f = keys(rule(JoinKind::Replicate));  // :340-347 set no key
  EXPECT_FALSE(f.cat_dim || f.param_n_sub_params || f.sub_param_shape);
  f = keys(rule(JoinKind::Average));
  EXPECT_FALSE(f.cat_dim || f.param_n_sub_params || f.sub_param_shape);
  f = keys(rule(JoinKind::TwoSubParams));  // :354-355
  EXPECT_EQ(f.cat_dim, 0);
  EXPECT_EQ(f.param_n_sub_params, 2);
  f = keys(rule(JoinKind::SubParams));  // :441
  ASSERT_TRUE(f.sub_param_shape);
  EXPECT_EQ(f.sub_param_shape->sub_sizes, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_FALSE(f.cat_dim);
  f = keys(rule(JoinKind::Cat, 1));  // :447
  EXPECT_EQ(f.cat_dim, 1);
  EXPECT_FALSE(f.param_n_sub_params || f.sub_param_shape);
}

TEST(Join, SplitRefusesWhatTpDoesNotDivide) {
  const std::string e = ucpkit::testing::error_of([] { (void)split("w", {8, 6}, rule(JoinKind::Cat, 1), {}, 4, 0); });
  EXPECT_NE(e.find("tp=4 does not divide the split dimension 6"), std::string::npos) << e;
  EXPECT_NE(e.find("dim 1 of w"), std::string::npos) << e;
  const std::string odd = ucpkit::testing::error_of([] { (void)split("h", {6, 2}, rule(JoinKind::TwoSubParams), {}, 2, 0); });
  EXPECT_NE(odd.find("tp=2 does not divide the sub-parameter size 3"), std::string::npos) << odd;
}

}  // namespace universal_join_test
