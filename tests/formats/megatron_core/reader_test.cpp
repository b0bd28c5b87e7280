// formats/megatron_core: every tensor of every committed real Megatron-Core torch_dist checkpoint
// (tests/formats/megatron_core/data, written by Megatron-LM's own save_checkpoint over gloo ranks,
// scripts/fixtures/mcore_fixtures.sh) read through the typed key model and compared bit-exact with the full
// tensors Megatron's own reader returned (dist_checkpointing.load_plain_tensors ->
// <variant>.truth/tensors.safetensors): model parameters per layer and per expert, the
// fully_reshardable optimizer state per parameter, the dp_reshardable flat buckets.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "formats/megatron_core/reader.h"
#include "io/dtype.h"
#include "io/safetensors_file.h"
#include "formats/dcp/dcp_data.h"
#include "formats/megatron_core/mcore_data.h"

namespace megatron_core_reader_test {

using namespace ucpkit;
using namespace ucpkit::formats::megatron_core;
using ucpkit::testing::kMcoreData;

namespace {

struct Truth {
  std::map<std::string, SafetensorsTensor> tensors;
};

Truth truth_of(const std::string& variant) {
  const std::string p = kMcoreData + "/" + variant + ".truth/tensors.safetensors";
  return {parse_safetensors(ucpkit::testing::slurp(p), p)};
}

// The bytes of `slice` inside the truth tensor `want` (the leading axes are outermost, so one
// parameter is one contiguous run): computed here from the truth's own shape, not by our reader.
std::span<const uint8_t> truth_slice(const SafetensorsTensor& want, const ParamSlice& slice) {
  int64_t inner = 1;
  for (const auto d : slice.shape) inner *= d;
  int64_t flat = 0;
  for (size_t d = 0; d < slice.index.size(); ++d) flat = flat * want.shape[d] + slice.index[d];
  const size_t esize = want.bytes.size() / static_cast<size_t>(std::max<int64_t>(1, want.numel()));
  const size_t n = static_cast<size_t>(inner) * esize;
  return {reinterpret_cast<const uint8_t*>(want.bytes.data()) + static_cast<size_t>(flat) * n, n};
}

void expect_bytes(const Tensor& got, const SafetensorsTensor& want, std::span<const uint8_t> want_bytes,
                  const std::vector<int64_t>& shape, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(dtype_safetensors_name(got.dtype()), want.dtype);
  EXPECT_EQ(got.shape(), shape);
  const auto b = got.contiguous().contiguous_bytes();
  ASSERT_EQ(b.size(), want_bytes.size());
  EXPECT_EQ(0, std::memcmp(b.data(), want_bytes.data(), b.size())) << "values differ";
}

// Every tensor of the variant read through the model, against the truth; returns how many
// (parameter, state) values were compared.
size_t expect_matches_truth(const std::string& variant) {
  const Checkpoint ck(kMcoreData + "/" + variant);
  const Truth truth = truth_of(variant);
  std::set<std::string> seen;
  size_t compared = 0;
  for (const auto& p : ck.params()) {
    const auto& want = truth.tensors.at(p.fqn);
    seen.insert(p.fqn);
    expect_bytes(ck.read_param(p), want, truth_slice(want, p.slice), p.slice.shape, variant + " " + p.slice.name);
    ++compared;
    if (ck.optimizer_format() != OptimizerFormat::FullyReshardable) continue;
    for (const std::string state : {"param", "exp_avg", "exp_avg_sq"}) {
      const std::string fqn = "optimizer.state." + state + "." + p.fqn;
      const auto& ws = truth.tensors.at(fqn);
      seen.insert(fqn);
      expect_bytes(ck.read_param(p, state), ws, truth_slice(ws, p.slice), p.slice.shape,
                   variant + " " + state + " of " + p.slice.name);
      ++compared;
    }
  }
  for (const Key* b : ck.buckets()) {
    const auto& want = truth.tensors.at(b->fqn);
    seen.insert(b->fqn);
    const Tensor got = ck.read_bucket(*b);
    expect_bytes(got, want, {reinterpret_cast<const uint8_t*>(want.bytes.data()), want.bytes.size()}, want.shape,
                 variant + " " + b->fqn);
    ++compared;
  }
  std::set<std::string> truth_keys;
  for (const auto& [k, v] : truth.tensors) truth_keys.insert(k);
  EXPECT_EQ(seen, truth_keys) << variant << ": every tensor Megatron's reader returns is read through the model";
  return compared;
}

std::set<std::string> param_names(const Checkpoint& ck) {
  std::set<std::string> out;
  for (const auto& p : ck.params()) out.insert(p.slice.name);
  return out;
}

// The parameter names of save `form` (under the fixtures' folder), its every tensor first checked against its truth.
std::set<std::string> names_matching_truth(const std::string& form) {
  expect_matches_truth(form);
  return param_names(Checkpoint(kMcoreData + "/" + form));
}

}  // namespace

TEST(McoreReader, GptTp2Pp2BothOptimizerFormats) {
  // 2 layers x 10 parameters, embedding, final norm, output layer; 4 groups x 3 states of buckets
  EXPECT_EQ(expect_matches_truth("gpt_tp2_pp2/dp_reshardable"), 2u * 10 + 3 + 4 * 3);
  EXPECT_EQ(expect_matches_truth("gpt_tp2_pp2/fully_reshardable"), 4u * (2 * 10 + 3));  // value + 3 states
  const Checkpoint dp(kMcoreData + "/gpt_tp2_pp2/dp_reshardable");
  EXPECT_EQ(dp.optimizer_format(), OptimizerFormat::DpReshardable);
  EXPECT_EQ(dp.config().sharded_backend, "torch_dist");
  EXPECT_EQ(dp.config().sharded_backend_version, 1);
  EXPECT_FALSE(dp.common().legacy);
  EXPECT_EQ(dp.common().iteration(), 2);
  EXPECT_EQ(dp.common().content_string("distrib_optim_sharding_type"), "dp_reshardable");
  EXPECT_EQ(dp.common().checkpoint_version(), 3.0);  // training/checkpointing.py:1312
  ASSERT_NE(dp.common().arg("pipeline_model_parallel_size"), nullptr);
  EXPECT_EQ(dp.common().arg("pipeline_model_parallel_size")->i, 2);
  // homogeneous stack: one stored tensor per parameter with a prepended layer axis
  const auto& qkv = dp.param("decoder.layers.1.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.fqn, "decoder.layers.self_attention.linear_qkv.weight");
  EXPECT_EQ(qkv.slice.index, (std::vector<int64_t>{1}));
  EXPECT_EQ(qkv.slice.shape, (std::vector<int64_t>{48, 16}));
  // TP 2 x PP 2 = four model-parallel groups, one dp group index (and one bucket set) each
  std::set<int64_t> groups;
  for (const Key* b : dp.buckets()) groups.insert(b->bucket.dp_group_idx);
  EXPECT_EQ(groups, (std::set<int64_t>{0, 1, 2, 3}));
  const Checkpoint full(kMcoreData + "/gpt_tp2_pp2/fully_reshardable");
  EXPECT_EQ(full.optimizer_format(), OptimizerFormat::FullyReshardable);
  EXPECT_EQ(param_names(dp), param_names(full));
  // the same model state saved twice: the model values agree between the two saves
  for (const auto& p : dp.params()) EXPECT_TRUE(dp.read_param(p).equal(full.read_param(full.param(p.slice.name))));
}

TEST(McoreReader, LlamaGqaSwigluTp2Dp2LegacyCommonPt) {
  expect_matches_truth("llama_gqa_tp2_dp2_v016/dp_reshardable");
  expect_matches_truth("llama_gqa_tp2_dp2_v016/fully_reshardable");
  const Checkpoint ck(kMcoreData + "/llama_gqa_tp2_dp2_v016/fully_reshardable");
  EXPECT_TRUE(ck.common().legacy);  // Megatron-Core 0.16.1 writes common.pt
  EXPECT_EQ(ck.dcp().metadata().find("common_state/shard_0_1"), nullptr);
  EXPECT_EQ(ck.common().iteration(), 2);
  ASSERT_NE(ck.common().arg("num_query_groups"), nullptr);
  EXPECT_EQ(ck.common().arg("num_query_groups")->i, 2);
  // GQA: 4 heads of 4 + 2 x 2 key/value heads of 4 = 32 rows
  EXPECT_EQ(ck.param("decoder.layers.0.self_attention.linear_qkv.weight").slice.shape, (std::vector<int64_t>{32, 16}));
  // SwiGLU fc1 [W_all; V_all] (2 x ffn 32 rows): each TP rank's piece is stored as two chunks, one in
  // each half, not as one interleaved [W_r; V_r] block
  const auto* fc1 = ck.dcp().metadata().find("decoder.layers.mlp.linear_fc1.weight");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->size, (std::vector<int64_t>{2, 64, 16}));
  size_t in_w = 0, in_v = 0;
  for (const auto& c : fc1->chunks) {
    EXPECT_EQ(c.sizes[1], 16);  // ffn / TP rows of one half
    (c.offsets[1] < 32 ? in_w : in_v)++;
    EXPECT_LE(c.offsets[1] % 32 + c.sizes[1], 32) << "a chunk crosses the W/V boundary";
  }
  EXPECT_EQ(in_w, in_v);
  EXPECT_EQ(in_w, 2u * 2);  // 2 layers x 2 TP ranks
}

// An all-MoE model trained by Megatron-LM (scripts/fixtures/mcore_trained_fixtures.sh): a homogeneous stack, so
// the experts carry the layer axis and then the expert axis (decoder.layers.mlp.experts.experts.*).
TEST(McoreReader, TrainedAllMoeModelStacksLayersThenExperts) {
  const auto names = names_matching_truth("mixtral_ep2_trained/dp_reshardable");
  EXPECT_TRUE(names.count("decoder.layers.1.mlp.experts.experts.3.linear_fc2.weight"));
  EXPECT_TRUE(names.count("decoder.layers.0.mlp.router.weight"));
  EXPECT_EQ(names.size(), 3u + 2 * (4 + 1 + 2 * 4));  // embed, norm, head; per layer 2 norms, qkv, proj, router, 4 x (fc1, fc2)
}

// A dense Llama-style model trained by Megatron-LM at TP 2 x DP 2 (scripts/fixtures/mcore_trained_fixtures.sh):
// no linear biases, SwiGLU fc1 split [W; V] per TP rank, the fused layer norms of the local spec.
TEST(McoreReader, TrainedLlamaModelTp2) {
  const auto names = names_matching_truth("llama_tp2_trained/dp_reshardable");
  EXPECT_TRUE(names.count("decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_FALSE(names.count("decoder.layers.0.self_attention.linear_qkv.bias"));
  EXPECT_EQ(names.size(), 3u + 2 * 6);  // embed, final norm, head; per layer 2 norms, qkv, proj, fc1, fc2
}

// A Qwen2-MoE-shaped model trained by Megatron-LM (scripts/fixtures/mcore_trained_fixtures.sh): layer 0 dense,
// layer 1 MoE with a shared expert and its sigmoid gate; heterogeneous layers, so decoder.layers.{L}. keys.
TEST(McoreReader, TrainedModelWithADenseLayerAndAGatedSharedExpert) {
  const auto names = names_matching_truth("qwen2_moe_ep2_trained/dp_reshardable");
  EXPECT_TRUE(names.count("decoder.layers.0.mlp.linear_fc1.weight"));
  EXPECT_FALSE(names.count("decoder.layers.0.mlp.router.weight"));
  EXPECT_TRUE(names.count("decoder.layers.1.mlp.shared_experts.gate_weight"));
  EXPECT_FALSE(names.count("decoder.layers.1.mlp.linear_fc1.weight"));
  // embed, final norm, head; layer 0: 2 norms, qkv, proj, fc1, fc2; layer 1: 2 norms, qkv, proj, router,
  // 4 x (fc1, fc2), the shared expert's fc1, fc2 and gate
  EXPECT_EQ(names.size(), 3u + 6 + (4 + 1 + 2 * 4 + 3));
}

TEST(McoreReader, NativeMoeExpertsEp2) {
  expect_matches_truth("moe_ep2/dp_reshardable");
  expect_matches_truth("moe_ep2/fully_reshardable");
  const Checkpoint ck(kMcoreData + "/moe_ep2/dp_reshardable");
  // MoE layer frequency list: non-homogeneous layers, decoder.layers.{L}. keys, no layer axis
  // the expert number goes where singleton_local_shards puts it: <MoELayer.experts>.experts.{E}.
  const auto& e = ck.param("decoder.layers.1.mlp.experts.experts.3.linear_fc1.weight");
  EXPECT_EQ(e.fqn, "decoder.layers.1.mlp.experts.experts.linear_fc1.weight");
  EXPECT_EQ(e.slice.index, (std::vector<int64_t>{3}));
  EXPECT_EQ(e.slice.shape, (std::vector<int64_t>{48, 16}));  // SwiGLU: 2 x moe ffn 24
  size_t experts = 0;
  for (const auto& p : ck.params()) experts += p.key->model.expert_axis ? 1 : 0;
  EXPECT_EQ(experts, 2u * 4);  // fc1, fc2 of 4 experts
  EXPECT_NO_THROW(ck.param("decoder.layers.1.mlp.shared_experts.linear_fc1.weight"));
  EXPECT_NO_THROW(ck.param("decoder.layers.1.mlp.router.weight"));
  // dense and expert optimizers chained: chained_{i}. buckets, EP 2 gives the expert one two groups
  std::set<std::pair<int64_t, int64_t>> chains;
  for (const Key* b : ck.buckets()) chains.insert({b->chain, b->bucket.dp_group_idx});
  EXPECT_EQ(chains, (std::set<std::pair<int64_t, int64_t>>{{0, 0}, {1, 0}, {1, 1}}));
}

TEST(McoreReader, NativeMoeWithExpertTensorParallelism) {
  // TP 2 x EP 2 with Megatron-LM's default ETP = TP (training/arguments.py:569-570 at core_v0.19.0): each
  // expert tensor is stored as its 2 ETP pieces; issue 47
  expect_matches_truth("moe_tp2_etp2/dp_reshardable");
  expect_matches_truth("moe_tp2_etp2/fully_reshardable");
  const Checkpoint ck(kMcoreData + "/moe_tp2_etp2/fully_reshardable");
  const auto* fc2 = ck.dcp().metadata().find("decoder.layers.1.mlp.experts.experts.linear_fc2.weight");
  ASSERT_NE(fc2, nullptr);
  for (const auto& c : fc2->chunks) EXPECT_EQ(c.sizes.back(), 12) << "moe ffn 24 split by ETP 2 along columns";
  std::set<std::pair<int64_t, int64_t>> chains;
  for (const Key* b : Checkpoint(kMcoreData + "/moe_tp2_etp2/dp_reshardable").buckets())
    chains.insert({b->chain, b->bucket.dp_group_idx});
  EXPECT_EQ(chains, (std::set<std::pair<int64_t, int64_t>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 2}, {1, 3}}));
}

}  // namespace megatron_core_reader_test
