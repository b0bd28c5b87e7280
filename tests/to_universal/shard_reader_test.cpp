// lib/to_universal/shard_reader: ShardView over a real ZeRO-1 shard of a fixture (groups, states, step, its
// fragments read back into a parameter equal to the truth's fp32 master), and the fragment readers over small
// work-folder fragment files written here (dict state -> 1-D tensor, "step"), with their errors.
#include "to_universal/shard_reader.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/paths.h"
#include "to_universal/extract.h"

namespace fs = std::filesystem;

namespace ucpkit::to_universal {
namespace shard_reader_test {
namespace {

using pickle::Value;
using ucpkit::testing::error_of;

constexpr const char* kDp16 = "gpt_dp16_padding_ranks";  // tp 1, pp 1, ZeRO-1 over 16 ranks

using ucpkit::testing::TempDir;

std::string shard_path(int dp) {
  return kFx + "/" + kDp16 + "/global_step100/bf16_zero_pp_rank_" + std::to_string(dp) +
         "_mp_rank_00_optim_states.pt";
}

std::vector<float> iota(int n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

// A work-folder fragment file: {"fp32": [from, from + n), "exp_avg": the same negated, "step": 7}.
std::string fragment_file(const fs::path& dir, const std::string& name, int n, float from) {
  auto d = Value::dict(true);
  d->set_item("fp32", Value::of_tensor(Tensor::from_vector(DType::Float32, {n}, iota(n, from))));
  auto neg = iota(n, from);
  for (auto& x : neg) x = -x;
  d->set_item("exp_avg", Value::of_tensor(Tensor::from_vector(DType::Float32, {n}, neg)));
  d->set_item("step", Value::integer(7));
  const std::string path = (dir / name).string();
  save_torch_file(path, d);
  return path;
}

TEST(ShardView, AZeroOneShardHasItsGroupsStatesAndStep) {
  const auto root = load_torch(shard_path(0));
  const ShardView s(root, shard_path(0));
  EXPECT_FALSE(s.zero3());
  EXPECT_EQ(s.path(), shard_path(0));
  ASSERT_EQ(s.groups(), 2);  // the generator's weight-decay and no-decay groups
  for (int g = 0; g < 2; ++g) {
    EXPECT_EQ(s.states(g), (std::vector<std::string>{"fp32", "exp_avg", "exp_avg_sq"}));
    EXPECT_EQ(s.group_info(g).partition_count, 16);
    EXPECT_FALSE(s.group_info(g).moe);
    ASSERT_TRUE(s.has_step(g));
    EXPECT_EQ(s.step(g)->as_int(), 100);
    // The fragments lie in the partition, in buffer order.
    const int64_t partition = s.state_tensor(g, "fp32").numel();
    int64_t end = 0;
    for (const auto& [name, start, numel] : s.fragments(g)) {
      EXPECT_GE(start, end) << name;
      end = start + numel;
    }
    EXPECT_LE(end, partition);
    EXPECT_EQ(s.state_tensor(g, "exp_avg").numel(), partition);
  }
}

TEST(ShardView, MissingGroupsAndStatesAreNamed) {
  const ShardView s(load_torch(shard_path(0)), shard_path(0));
  auto what = error_of([&] { s.state_tensor(0, "momentum"); });
  EXPECT_NE(what.find(shard_path(0)), std::string::npos) << what;
  EXPECT_NE(what.find("has no momentum"), std::string::npos) << what;
  what = error_of([&] { s.fragments(5); });
  EXPECT_NE(what.find("has no group 5"), std::string::npos) << what;
  EXPECT_NE(error_of([&] { s.group_info(-1); }), "");
}

// The shards' fragments of one parameter, read in partition order, are the truth's fp32 master.
TEST(ShardReader, ReadSliceOfAFixtureParameterIsTheTruthsMaster) {
  const ExtractPlan plan = plan_checkpoint(kFx + "/" + kDp16, {});
  SourceCache cache(plan.files);
  for (const std::string name : {"language_model.encoder.layers.0.self_attention.dense.weight",
                                 "language_model.encoder.layers.0.input_layernorm.bias"}) {
    const ParamPlan* p = nullptr;
    for (const auto& q : plan.params)
      if (q.name == name) p = &q;
    ASSERT_NE(p, nullptr) << name;
    uint64_t bytes = 0;
    const Tensor t = read_slice(cache, p->fragments[0], "fp32", p->tp_shapes[0], &bytes);
    auto root = load_torch(kFx + "/" + kDp16 + "/truth/universal/zero/" + name + "/fp32.pt");
    const Tensor truth = root->at("param")->as_tensor();
    EXPECT_EQ(t.shape(), truth.shape()) << name;
    EXPECT_EQ(t.to_vector<float>(), truth.contiguous().to_vector<float>()) << name;
    EXPECT_EQ(bytes, t.nbytes());
    const pickle::ValuePtr step = read_step(cache, p->step_file, p->step_group);
    EXPECT_EQ(step->as_int(), 100);
  }
}

TEST(ShardReader, FragmentsOfWorkFilesAreNarrowedAndJoined) {
  TempDir d;
  SourceCache cache({fragment_file(d.path(), "a.pt", 10, 0), fragment_file(d.path(), "b.pt", 4, 100)});
  const Tensor f = fragment_tensor(cache, {0, -1, 2, 3, 0}, "fp32");
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{2, 3, 4}));
  uint64_t bytes = 5;
  const Tensor s = read_slice(cache, {{0, -1, 7, 3, 0}, {1, -1, 1, 3, 1}}, "exp_avg", {2, 3}, &bytes);
  EXPECT_EQ(s.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{-7, -8, -9, -101, -102, -103}));
  EXPECT_EQ(bytes, 5u + 24);
  EXPECT_EQ(read_step(cache, 1, -1)->as_int(), 7);
  EXPECT_EQ(cache.path(1), (d.path() / "b.pt").string());
}

TEST(ShardReader, BadFragmentsAreNamed) {
  TempDir d;
  const std::string a = fragment_file(d.path(), "a.pt", 10, 0);
  auto half = Value::dict(true);
  half->set_item("fp32", Value::of_tensor(Tensor::zeros(DType::Float16, {4})));
  half->set_item("grid", Value::of_tensor(Tensor::zeros(DType::Float32, {2, 2})));
  const std::string h = (d.path() / "h.pt").string();
  save_torch_file(h, half);
  SourceCache cache({a, h});
  auto what = error_of([&] { fragment_tensor(cache, {0, -1, 8, 4, 0}, "fp32"); });
  EXPECT_NE(what.find(a), std::string::npos) << what;
  EXPECT_NE(what.find("fp32 partition has 10 elements, fragment needs [8, 12)"), std::string::npos) << what;
  what = error_of([&] { fragment_tensor(cache, {0, -1, 0, 1, 0}, "exp_avg_sq"); });
  EXPECT_NE(what.find("fragment file has no tensor exp_avg_sq"), std::string::npos) << what;
  what = error_of([&] { fragment_tensor(cache, {1, -1, 0, 1, 0}, "grid"); });
  EXPECT_NE(what.find("grid partition is not 1-D"), std::string::npos) << what;
  what = error_of([&] { read_slice(cache, {{0, -1, 0, 2, 0}, {1, -1, 0, 2, 1}}, "fp32", {4}, nullptr); });
  EXPECT_NE(what.find(h), std::string::npos) << what;
  EXPECT_NE(what.find("fragment dtype float16 differs from float32"), std::string::npos) << what;
  what = error_of([&] { read_slice(cache, {}, "fp32", {0}, nullptr); });
  EXPECT_NE(what.find("no fragments for fp32"), std::string::npos) << what;
  what = error_of([&] { read_step(cache, 1, -1); });
  EXPECT_NE(what.find("fragment file has no step"), std::string::npos) << what;
}

TEST(ShardReader, ReadIntoCopiesAMappedTensorAndRefusesOthers) {
  TempDir d;
  SourceCache cache({fragment_file(d.path(), "a.pt", 10, 0)});
  const Tensor mapped = cache.get(0)->root->at("fp32")->as_tensor();
  std::vector<float> out(10, -1);
  ASSERT_TRUE(cache.read_into(0, mapped, reinterpret_cast<uint8_t*>(out.data())));
  EXPECT_EQ(out, iota(10, 0));
  EXPECT_FALSE(cache.read_into(0, Tensor::from_vector(DType::Float32, {2}, std::vector<float>{1, 2}),
                               reinterpret_cast<uint8_t*>(out.data())));
  // Released pages of a file mapping are read again from the file: the values stay.
  release_pages(mapped);
  EXPECT_EQ(mapped.to_vector<float>(), iota(10, 0));
  release_pages(Tensor::from_vector(DType::Float32, {2}, std::vector<float>{1, 2}));  // owned: nothing to do
}

TEST(ShardReader, TheCacheLoadsEachFileOnce) {
  TempDir d;
  SourceCache cache({fragment_file(d.path(), "a.pt", 3, 0)});
  EXPECT_EQ(cache.get(0).get(), cache.get(0).get());
  const std::string missing = (d.path() / "gone.pt").string();
  SourceCache bad({missing});
  EXPECT_NE(error_of([&] { bad.get(0); }).find("gone.pt"), std::string::npos);
}

}  // namespace
}  // namespace shard_reader_test
}  // namespace ucpkit::to_universal
