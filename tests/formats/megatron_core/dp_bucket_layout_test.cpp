// formats/megatron_core/dp_bucket_layout: the dp_reshardable buckets of the real fixtures unflattened
// into TP-local parameters (layout recomputed from the checkpoint, not stored in it) and compared
// bit-exact, for every state (param, exp_avg, exp_avg_sq), with the same optimizer state saved by the
// same run in fully_reshardable form (model space), cut to that TP rank's piece; the saved
// per_bucket_numel{,_unpadded} checked against those layouts.
#include <gtest/gtest.h>

#include "formats/megatron_core/dp_bucket_layout.h"
#include "formats/megatron_core/mcore_data.h"
#include "formats/megatron_core/reader.h"

namespace megatron_core_dp_bucket_layout_test {

using namespace ucpkit;
using namespace ucpkit::formats::megatron_core;
using ucpkit::testing::kMcoreData;

namespace {

// Returns the number of (parameter, state) pieces compared.
size_t expect_buckets_match_fully_reshardable(const std::string& name, bool experts = false) {
  const Checkpoint dp(kMcoreData + "/" + name + "/dp_reshardable");
  const Checkpoint full(kMcoreData + "/" + name + "/fully_reshardable");
  size_t compared = 0;
  for (const auto& layout : experts ? expert_bucket_layouts(dp) : dense_bucket_layouts(dp)) {
    for (const std::string state : {"param", "exp_avg", "exp_avg_sq"}) {
      std::string fqn = layout.bucket->fqn;
      fqn.replace(fqn.size() - 5, 5, state);  // ...bucket_idx_0.param -> .<state>
      const Key* key = nullptr;
      for (const auto& k : dp.keys())
        if (k.fqn == fqn) key = &k;
      EXPECT_NE(key, nullptr) << fqn;
      if (!key) continue;
      const Tensor bucket = dp.read_bucket(*key);
      for (const auto& p : layout.params) {
        const Tensor want = tp_local_piece(full.read_param(full.param(p.name), state), p);
        EXPECT_TRUE(bucket_param(bucket, p).equal(want))
            << name << " dp group " << layout.bucket->bucket.dp_group_idx << " " << state << " of " << p.name;
        ++compared;
      }
    }
  }
  return compared;
}

}  // namespace

TEST(McoreDpBuckets, GptTp2Pp2) {
  // 4 dp groups (TP 2 x PP 2), each one layer (10 parameters) plus embedding or final norm + output
  EXPECT_EQ(expect_buckets_match_fully_reshardable("gpt_tp2_pp2"), 3u * (2 * 11 + 2 * 12));
}

TEST(McoreDpBuckets, LlamaGqaSwigluTp2Dp2) {
  // 2 dp groups (TP 2), 2 layers x 6 parameters (no biases) + embedding + final norm + output; each
  // bucket split between 2 DP ranks (their pieces assembled by the DCP reader); SwiGLU fc1 as [W_t; V_t]
  EXPECT_EQ(expect_buckets_match_fully_reshardable("llama_gqa_tp2_dp2_v016"), 3u * 2 * (2 * 6 + 3));
}

TEST(McoreDpBuckets, MoeExpertBuffer) {
  // chained_1: 2 expert dp groups (EP 2), each its 2 local experts' fc1 and fc2 (SequentialMLP:
  // expert by expert, reversed)
  EXPECT_EQ(expect_buckets_match_fully_reshardable("moe_ep2", true), 3u * 2 * 4);
}

TEST(McoreDpBuckets, MoeExpertBufferWithExpertTensorParallelism) {
  // Megatron-LM's default ETP = TP (training/arguments.py:569-570 at core_v0.19.0): TP 2, EP 2, ETP 2 on 4
  // ranks, so 4 expert dp groups (tp-ep-pp rank: ETP rank fastest), each its EP rank's 2 local experts'
  // ETP-local pieces (fc1 as [W_t; V_t] of its SwiGLU halves, fc2 split by columns); issue 47
  EXPECT_EQ(expect_buckets_match_fully_reshardable("moe_tp2_etp2", true), 3u * 4 * 4);
  EXPECT_EQ(expect_buckets_match_fully_reshardable("moe_tp2_etp2"), 3u * 2 * (6 + 7 + 3));
}

TEST(McoreDpBuckets, MoeDenseBuffer) {
  // the dense optimizer's bucket (chained_0)
  // dense layer 0 (6), MoE layer 1 without its experts (qkv norm, proj, qkv, pre-MLP norm, router,
  // shared fc1, fc2: 7), embedding, final norm, output
  EXPECT_EQ(expect_buckets_match_fully_reshardable("moe_ep2"), 3u * (6 + 7 + 3));
}

// per_bucket_numel{,_unpadded} (optimizer/distrib_optimizer.py:728-745) against the layouts: the real
// fixtures' objects (dicts keyed by a tuple of torch dtypes, as Megatron pickles them) agree.
TEST(McoreBucketNumels, RealFixturesAgreeWithTheRecomputedLayouts) {
  for (const std::string name : {"gpt_tp2_pp2", "llama_gqa_tp2_dp2_v016", "moe_ep2", "moe_tp2_etp2"}) {
    SCOPED_TRACE(name);
    const Checkpoint dp(kMcoreData + "/" + name + "/dp_reshardable");
    auto layouts = dense_bucket_layouts(dp);
    if (name.rfind("moe_", 0) == 0)
      for (auto& l : expert_bucket_layouts(dp)) layouts.push_back(std::move(l));
    EXPECT_NO_THROW(check_per_bucket_numel(dp, layouts));
  }
  const Checkpoint llama(kMcoreData + "/llama_gqa_tp2_dp2_v016/dp_reshardable");
  for (const auto& [item, numel] : {std::pair{"per_bucket_numel", 4224}, std::pair{"per_bucket_numel_unpadded", 4160}}) {
    const auto saved =
        buffer_numels(*llama.read_object("optimizer.distributed.dp_group_idx_1." + std::string(item) + "/shard_0_1"));
    ASSERT_TRUE(saved.has_value()) << item;
    ASSERT_EQ(saved->size(), 1u);
    EXPECT_EQ((*saved)[0].dtypes, "(torch.bfloat16, torch.float32)");
    EXPECT_EQ((*saved)[0].numel, std::vector<int64_t>{numel});
  }
}

TEST(McoreBucketNumels, BufferNumelsTakesOnlyTheSavedForm) {
  using pickle::Value;
  const auto buffer = [](pickle::ValuePtr key, pickle::ValuePtr numels) {
    auto d = Value::dict();
    d->entries.emplace_back(key, numels);
    return Value::list({d});
  };
  const auto dtypes = Value::tuple({Value::torch_dtype(DType::Float16), Value::torch_dtype(DType::Float32)});
  const auto ok = buffer_numels(*buffer(dtypes, Value::list({Value::integer(128), Value::integer(256)})));
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ((*ok)[0].dtypes, "(torch.float16, torch.float32)");
  EXPECT_EQ((*ok)[0].numel, (std::vector<int64_t>{128, 256}));
  EXPECT_FALSE(buffer_numels(*buffer(Value::str("(torch.float16, torch.float32)"), Value::list())));
  EXPECT_FALSE(buffer_numels(*buffer(dtypes, Value::list({Value::str("128")}))));
  EXPECT_FALSE(buffer_numels(*Value::dict()));
}

TEST(McoreBucketNumels, EachDisagreementIsSaid) {
  const std::string bf16 = "(torch.bfloat16, torch.float32)";
  // llama_gqa_tp2_dp2_v016's bucket: layout end = stored length 4160, padded to lcm(dp 2, 128)
  const std::vector<BucketNumel> bucket = {{0, 0, bf16, 4160, 4160, 128}};
  const auto saved = [&](std::vector<int64_t> numel) { return std::vector<BufferNumels>{{bf16, std::move(numel)}}; };
  EXPECT_EQ(bucket_numel_mismatch(saved({4224}), false, bucket), "");
  EXPECT_EQ(bucket_numel_mismatch(saved({4160}), true, bucket), "");
  EXPECT_EQ(bucket_numel_mismatch(saved({4352}), false, bucket),
            "numel of bucket 0 of buffer 0: expected 4224 (the recomputed layout's end 4160 padded to a multiple of 128), "
            "stored 4352");
  EXPECT_EQ(bucket_numel_mismatch(saved({4096}), true, bucket),
            "numel of bucket 0 of buffer 0: expected 4160 (the stored bucket's length), stored 4096");
  // pad_buckets_for_high_nccl_busbw: lcm(2, 128, 2^16)
  EXPECT_EQ(bucket_numel_mismatch(saved({65536}), false, {{0, 0, bf16, 4160, 4160, 65536}}), "");
  // a stored length the layout does not end at: the unpadded sum against the layout
  EXPECT_EQ(bucket_numel_mismatch(saved({4096}), true, {{0, 0, bf16, 4160, 4096, 128}}),
            "numel of buffer 0: expected 4160 (its recomputed layouts' parameters), stored 4096 in all");
  EXPECT_EQ(bucket_numel_mismatch(saved({4160, 64}), true, bucket), "buffer 0: 2 buckets listed, 1 stored");
  auto two = saved({4224});
  two.push_back({bf16, {128}});
  EXPECT_EQ(bucket_numel_mismatch(two, false, bucket), "buffer 1: 1 buckets listed, 0 stored");
  EXPECT_EQ(bucket_numel_mismatch({}, false, bucket), "no numel of bucket 0 of buffer 0 (0 buffers listed)");
  EXPECT_EQ(bucket_numel_mismatch({{"(torch.float32, torch.float32)", {4224}}}, false, bucket),
            "buffer 0 is (torch.float32, torch.float32), its bucket keys (torch.bfloat16, torch.float32)");
}

}  // namespace megatron_core_dp_bucket_layout_test
