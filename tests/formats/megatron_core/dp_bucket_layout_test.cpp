// formats/megatron_core/dp_bucket_layout: the dp_reshardable buckets of the real fixtures unflattened
// into TP-local parameters (layout recomputed from the checkpoint, not stored in it) and compared
// bit-exact, for every state (param, exp_avg, exp_avg_sq), with the same optimizer state saved by the
// same run in fully_reshardable form (model space), cut to that TP rank's piece.
#include <gtest/gtest.h>

#include "formats/megatron_core/dp_bucket_layout.h"
#include "formats/megatron_core/mcore_data.h"
#include "formats/megatron_core/reader.h"

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

TEST(McoreDpBuckets, MoeDenseBuffer) {
  // the dense optimizer's bucket (chained_0)
  // dense layer 0 (6), MoE layer 1 without its experts (qkv norm, proj, qkv, pre-MLP norm, router,
  // shared fc1, fc2: 7), embedding, final norm, output
  EXPECT_EQ(expect_buckets_match_fully_reshardable("moe_ep2"), 3u * (6 + 7 + 3));
}
