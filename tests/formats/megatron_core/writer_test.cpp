// The torch_dist write plan of formats/megatron_core/writer.h, without I/O: stored keys, leading axes, TP
// pieces, the rank that writes each chunk and the files. Expected values worked out by hand from
// Megatron-Core's layout (docs/formats-megatron-core.md): TP rank t, stage s, EP rank r write as
// t + TP * r + TP * DP * s; column-parallel rows (qkv, fc1, embedding, output layer), row-parallel
// columns (proj, fc2); SwiGLU fc1 in 2 * TP row pieces.
#include "formats/megatron_core/writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"

namespace ucpkit::formats::megatron_core {
namespace megatron_core_writer_test {
namespace {

struct Params {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  void add(const std::string& n, std::vector<int64_t> s) {
    names.push_back(n);
    shapes.push_back(std::move(s));
  }
};

// A 2-layer GPT in Megatron-Core universal names: hidden 4, vocabulary 8, qkv rows 12.
Params dense_gpt() {
  Params p;
  p.add("embedding.word_embeddings.weight", {8, 4});
  for (int l = 0; l < 2; ++l) {
    const std::string L = "decoder.layers." + std::to_string(l) + ".";
    p.add(L + "self_attention.linear_qkv.weight", {12, 4});
    p.add(L + "self_attention.linear_proj.weight", {4, 4});
    p.add(L + "input_layernorm.weight", {4});
  }
  p.add("decoder.final_layernorm.weight", {4});
  p.add("output_layer.weight", {8, 4});
  return p;
}

size_t key_index(const TorchDistWritePlan& plan, const std::string& key) {
  for (size_t k = 0; k < plan.keys.size(); ++k)
    if (plan.keys[k].key == key) return k;
  ADD_FAILURE() << "no stored key " << key;
  return 0;
}

size_t entry_index(const TorchDistWritePlan& plan, const std::string& fqn) {
  for (size_t e = 0; e < plan.plan.entries.size(); ++e)
    if (plan.plan.entries[e].fqn == fqn) return e;
  ADD_FAILURE() << "no entry " << fqn;
  return 0;
}

// rank -> (entry fqn, chunk) it writes
std::map<int64_t, std::vector<std::pair<std::string, size_t>>> writers(const TorchDistWritePlan& plan) {
  std::map<int64_t, std::vector<std::pair<std::string, size_t>>> out;
  for (const auto& f : plan.plan.files)
    for (const auto& item : f.items) out[f.rank].emplace_back(plan.plan.entries[item.entry].fqn, item.chunk);
  return out;
}

int64_t rank_of(const TorchDistWritePlan& plan, const std::string& fqn, size_t chunk) {
  const size_t e = entry_index(plan, fqn);
  for (const auto& f : plan.plan.files)
    for (const auto& item : f.items)
      if (item.entry == e && item.chunk == chunk) return f.rank;
  ADD_FAILURE() << "nobody writes " << fqn << " chunk " << chunk;
  return -1;
}

WriteLayout layout(int64_t tp, int64_t pp, int64_t dp, int64_t layers) {
  WriteLayout l;
  l.mesh.tp = tp;
  l.mesh.pp = pp;
  l.mesh.dp = dp;
  l.num_layers = layers;
  return l;
}

TEST(MegatronCoreWriter, LayersAreStackedOnlyWhenEveryLayerHasTheSameSpec) {
  EXPECT_TRUE(homogeneous_layers(false, 1, false, 1, false));
  EXPECT_FALSE(homogeneous_layers(true, 1, false, 1, false));   // moe_layer_freq a list
  EXPECT_FALSE(homogeneous_layers(false, 2, false, 1, false));  // every second layer MoE
  EXPECT_FALSE(homogeneous_layers(false, 1, true, 1, false));
  EXPECT_FALSE(homogeneous_layers(false, 1, false, 3, false));
  EXPECT_FALSE(homogeneous_layers(false, 1, false, 1, true));
}

TEST(MegatronCoreWriter, HomogeneousLayersBecomeOneKeyWithALayerAxis) {
  const Params p = dense_gpt();
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, layout(2, 2, 1, 2), "u");
  ASSERT_EQ(plan.keys.size(), 6u);  // embedding, qkv, proj, layernorm, final layernorm, output layer
  const StoredKey& qkv = plan.keys[key_index(plan, "decoder.layers.self_attention.linear_qkv.weight")];
  EXPECT_EQ(qkv.size, (std::vector<int64_t>{2, 12, 4}));
  EXPECT_EQ(qkv.leading, 1u);
  EXPECT_EQ(qkv.tp_dim, 0);
  EXPECT_EQ(qkv.parts(), 2);
  EXPECT_EQ(qkv.members, (std::vector<size_t>{1, 4}));  // layer 0, layer 1: indices into the names
  const StoredKey& proj = plan.keys[key_index(plan, "decoder.layers.self_attention.linear_proj.weight")];
  EXPECT_EQ(proj.tp_dim, 1);  // row-parallel: split along the input columns
  const StoredKey& norm = plan.keys[key_index(plan, "decoder.layers.input_layernorm.weight")];
  EXPECT_EQ(norm.tp_dim, -1);
  EXPECT_EQ(norm.parts(), 1);
  const StoredKey& emb = plan.keys[key_index(plan, "embedding.word_embeddings.weight")];
  EXPECT_EQ(emb.leading, 0u);
  EXPECT_EQ(emb.size, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(emb.tp_dim, 0);  // vocab-parallel
}

TEST(MegatronCoreWriter, EachChunkIsWrittenByItsStageAndTensorParallelRank) {
  const Params p = dense_gpt();
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, layout(2, 2, 1, 2), "u");
  const std::string qkv = "decoder.layers.self_attention.linear_qkv.weight";
  const auto& chunks = plan.plan.entries[entry_index(plan, qkv)].chunks;
  ASSERT_EQ(chunks.size(), 4u);  // 2 layers x 2 TP pieces
  // layer 1, TP piece 1: rows 6..11 of the layer's [12, 4], written by TP rank 1 of stage 1 = rank 3
  EXPECT_EQ(chunks[3].offsets, (std::vector<int64_t>{1, 6, 0}));
  EXPECT_EQ(chunks[3].sizes, (std::vector<int64_t>{1, 6, 4}));
  EXPECT_EQ(rank_of(plan, qkv, 0), 0);
  EXPECT_EQ(rank_of(plan, qkv, 1), 1);
  EXPECT_EQ(rank_of(plan, qkv, 2), 2);
  EXPECT_EQ(rank_of(plan, qkv, 3), 3);
  // the embedding on the first stage, the output layer and the final norm on the last
  EXPECT_EQ(rank_of(plan, "embedding.word_embeddings.weight", 1), 1);
  EXPECT_EQ(rank_of(plan, "output_layer.weight", 0), 2);
  EXPECT_EQ(rank_of(plan, "output_layer.weight", 1), 3);
  EXPECT_EQ(rank_of(plan, "decoder.final_layernorm.weight", 0), 2);
  // one file per writing rank, named as torch's FileSystemWriter names it
  ASSERT_EQ(plan.plan.files.size(), 4u);
  for (const auto& f : plan.plan.files) EXPECT_EQ(f.relative_path, "__" + std::to_string(f.rank) + "_0.distcp");
}

TEST(MegatronCoreWriter, OptimizerStatesFollowTheModelKeysInFp32AndBytesGoToRankZero) {
  const Params p = dense_gpt();
  WriteLayout l = layout(1, 1, 1, 2);
  l.model_dtype = DType::BFloat16;
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {"common_state/shard_0_1"}, l, "u");
  ASSERT_EQ(plan.plan.entries.size(), 6u + 3 * 6u + 1u);
  EXPECT_EQ(plan.plan.entries[0].dtype, DType::BFloat16);
  const size_t e = entry_index(plan, "optimizer.state.exp_avg_sq.decoder.layers.self_attention.linear_proj.weight");
  EXPECT_EQ(plan.plan.entries[e].dtype, DType::Float32);
  EXPECT_EQ(plan.plan.entries[e].size, (std::vector<int64_t>{2, 4, 4}));
  EXPECT_EQ(plan.sources[e].kind, EntrySource::State);
  EXPECT_EQ(plan.sources[e].state, "exp_avg_sq");
  const dcp::Entry& bytes = plan.plan.entries.back();
  EXPECT_TRUE(bytes.is_bytes);
  EXPECT_EQ(bytes.fqn, "common_state/shard_0_1");
  EXPECT_EQ(plan.sources.back().kind, EntrySource::Bytes);
  const auto w = writers(plan);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w.at(0).back(), std::make_pair(std::string("common_state/shard_0_1"), dcp::PlannedItem::kBytes));

  l.optimizer = false;
  EXPECT_EQ(plan_torch_dist_write(p.names, p.shapes, {}, l, "u").plan.entries.size(), 6u);
}

TEST(MegatronCoreWriter, EachParametersItemsAreWrittenTogetherItsModelCopyFirst) {
  const Params p = dense_gpt();
  WriteLayout l = layout(2, 1, 1, 2);
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {"common_state/shard_0_1"}, l, "u");
  const auto& order = plan.plan.write_order;
  size_t items = 0;
  for (const auto& e : plan.plan.entries) items += e.is_bytes ? 1 : e.chunks.size();
  ASSERT_EQ(order.size(), items);  // every item once (the writer checks it too)
  EXPECT_TRUE(plan.plan.entries[order[0].entry].is_bytes);
  // Parameter by parameter (each one's items in one run): its model chunks (two TP pieces, or one replicated), then as
  // many of param, exp_avg and exp_avg_sq, in that order.
  const std::vector<std::string> kinds = {"model", "param", "exp_avg", "exp_avg_sq"};
  auto kind = [&](const dcp::PlannedItem& it) {
    const EntrySource& s = plan.sources[it.entry];
    return static_cast<size_t>(std::find(kinds.begin(), kinds.end(), s.kind == EntrySource::Model ? "model" : s.state) -
                               kinds.begin());
  };
  std::vector<size_t> params;
  std::vector<std::vector<size_t>> runs;  // per parameter, the kinds of its items in write order
  for (size_t i = 1; i < order.size(); ++i) {
    const size_t param = chunk_origin(plan, order[i].entry, order[i].chunk).param;
    if (params.empty() || params.back() != param) {
      EXPECT_EQ(std::count(params.begin(), params.end(), param), 0) << "parameter " << param << " in two runs";
      params.push_back(param);
      runs.emplace_back();
    }
    runs.back().push_back(kind(order[i]));
  }
  EXPECT_EQ(params.size(), p.names.size());
  for (const auto& run : runs) {
    const size_t pieces = run.size() / kinds.size();
    std::vector<size_t> want;
    for (size_t k = 0; k < kinds.size(); ++k) want.insert(want.end(), pieces, k);
    EXPECT_EQ(run, want);
  }
  const size_t qkv = static_cast<size_t>(std::find(p.names.begin(), p.names.end(), "decoder.layers.0.self_attention.linear_qkv.weight") -
                                         p.names.begin());
  EXPECT_EQ(runs.at(static_cast<size_t>(std::find(params.begin(), params.end(), qkv) - params.begin())).size(), 8u);  // TP pieces
}

TEST(MegatronCoreWriter, SwigluFc1IsCutInItsTwoHalvesEvenAtTensorParallelOne) {
  Params p;
  p.add("decoder.layers.0.mlp.linear_fc1.weight", {16, 4});  // [W; V], ffn 8
  WriteLayout l = layout(1, 1, 1, 1);
  l.swiglu = true;
  TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, l, "u");
  ASSERT_EQ(plan.keys.size(), 1u);
  EXPECT_TRUE(plan.keys[0].swiglu);
  EXPECT_EQ(plan.keys[0].parts(), 2);
  const auto& chunks = plan.plan.entries[0].chunks;
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].offsets, (std::vector<int64_t>{0, 8, 0}));  // the V half
  // at TP 2, TP rank 1 writes pieces 1 and 3: its W quarter and its V quarter
  l.mesh.tp = 2;
  plan = plan_torch_dist_write(p.names, p.shapes, {}, l, "u");
  const std::string fc1 = "decoder.layers.mlp.linear_fc1.weight";
  EXPECT_EQ(rank_of(plan, fc1, 0), 0);
  EXPECT_EQ(rank_of(plan, fc1, 1), 1);
  EXPECT_EQ(rank_of(plan, fc1, 2), 0);
  EXPECT_EQ(rank_of(plan, fc1, 3), 1);
  EXPECT_EQ(plan.plan.entries[0].chunks[3].offsets, (std::vector<int64_t>{0, 12, 0}));
}

TEST(MegatronCoreWriter, ExpertsGetAnExpertAxisAndAreWrittenByTheirExpertParallelRank) {
  Params p;
  for (int l = 0; l < 2; ++l)
    for (int e = 0; e < 4; ++e)
      p.add("decoder.layers." + std::to_string(l) + ".mlp.experts.experts." + std::to_string(e) + ".linear_fc2.weight",
            {4, 6});
  WriteLayout l = layout(2, 1, 2, 2);
  l.mesh.ep = 2;
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, l, "u");
  ASSERT_EQ(plan.keys.size(), 1u);
  const StoredKey& k = plan.keys[0];
  EXPECT_EQ(k.key, "decoder.layers.mlp.experts.experts.linear_fc2.weight");
  EXPECT_TRUE(k.expert);
  EXPECT_EQ(k.leading, 2u);
  EXPECT_EQ(k.size, (std::vector<int64_t>{2, 4, 4, 6}));
  EXPECT_EQ(k.tp, 1);       // expert tensor parallelism 1
  EXPECT_EQ(k.parts(), 1);  // fc2 of an expert is not TP-split
  EXPECT_EQ(k.members.size(), 8u);
  EXPECT_EQ(k.members[1 * 4 + 3], 7u);  // layer 1, expert 3
  const std::string fqn = k.key;
  // experts 0-1 on EP rank 0 (rank 0), experts 2-3 on EP rank 1 (rank TP * 1 = 2)
  EXPECT_EQ(rank_of(plan, fqn, 1), 0);
  EXPECT_EQ(rank_of(plan, fqn, 2), 2);
  EXPECT_EQ(rank_of(plan, fqn, 7), 2);
  const ChunkOrigin o = chunk_origin(plan, entry_index(plan, fqn), 6);  // layer 1, expert 2
  EXPECT_EQ(o.param, 6u);
  EXPECT_EQ(o.box.offsets, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(o.box.sizes, (std::vector<int64_t>{4, 6}));
}

TEST(MegatronCoreWriter, NonHomogeneousLayersKeepTheLayerNumberInTheKey) {
  Params p;
  p.add("decoder.layers.0.self_attention.linear_proj.weight", {4, 4});
  p.add("decoder.layers.1.self_attention.linear_proj.weight", {4, 4});
  WriteLayout l = layout(2, 2, 1, 2);
  l.homogeneous = false;
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, l, "u");
  ASSERT_EQ(plan.keys.size(), 2u);
  EXPECT_EQ(plan.keys[1].key, "decoder.layers.1.self_attention.linear_proj.weight");
  EXPECT_EQ(plan.keys[1].leading, 0u);
  EXPECT_EQ(plan.keys[1].stage_layer, 1);
  const std::string fqn = plan.keys[1].key;
  EXPECT_EQ(rank_of(plan, fqn, 0), 2);  // stage 1, TP rank 0
  const ChunkOrigin o = chunk_origin(plan, entry_index(plan, fqn), 1);
  EXPECT_EQ(o.param, 1u);
  EXPECT_EQ(o.box.offsets, (std::vector<int64_t>{0, 2}));  // columns 2..3
  EXPECT_EQ(o.box.sizes, (std::vector<int64_t>{4, 2}));
}

// Layer 0 dense, layer 1 MoE (a router): the pre-MLP norm as the local spec names it in both.
Params dense_then_moe() {
  Params p;
  for (int l = 0; l < 2; ++l) p.add("decoder.layers." + std::to_string(l) + ".mlp.linear_fc1.layer_norm_weight", {4});
  p.add("decoder.layers.1.mlp.router.weight", {2, 4});
  return p;
}

TEST(MegatronCoreWriter, AnMoeLayersPreMlpNormIsAlsoStoredUnderTheTransformerEngineSpecsKey) {
  const Params p = dense_then_moe();
  WriteLayout l = layout(1, 1, 1, 2);
  l.homogeneous = false;
  l.both_norm_keys = true;
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, l, "u");
  const StoredKey& alias = plan.keys[key_index(plan, "decoder.layers.1.pre_mlp_layernorm.weight")];
  EXPECT_EQ(alias.members, (std::vector<size_t>{1}));  // reads layer 1's norm
  EXPECT_EQ(alias.size, (std::vector<int64_t>{4}));
  for (const auto& k : plan.keys) EXPECT_NE(k.key, "decoder.layers.0.pre_mlp_layernorm.weight") << "a dense layer's";
  entry_index(plan, "optimizer.state.exp_avg.decoder.layers.1.pre_mlp_layernorm.weight");
  // Written right after the norm it repeats (one parameter state in memory at a time).
  const auto& order = plan.plan.write_order;
  std::vector<size_t> params;
  for (const auto& it : order)
    if (it.chunk != dcp::PlannedItem::kBytes) params.push_back(chunk_origin(plan, it.entry, it.chunk).param);
  EXPECT_TRUE(std::is_sorted(params.begin(), params.end()));

  l.both_norm_keys = false;  // a source whose Megatron run chose a spec: its keys only
  EXPECT_EQ(plan_torch_dist_write(p.names, p.shapes, {}, l, "u").keys.size(), 3u);
}

TEST(MegatronCoreWriter, AnMoeLayersNormInTheTransformerEngineSpecsNameGetsTheLocalSpecsToo) {
  Params p;
  p.add("decoder.layers.0.pre_mlp_layernorm.weight", {4});
  p.add("decoder.layers.0.mlp.router.weight", {2, 4});
  WriteLayout l = layout(1, 1, 1, 1);
  l.both_norm_keys = true;
  const TorchDistWritePlan plan = plan_torch_dist_write(p.names, p.shapes, {}, l, "u");
  EXPECT_EQ(plan.keys[key_index(plan, "decoder.layers.mlp.linear_fc1.layer_norm_weight")].members, (std::vector<size_t>{0}));
}

TEST(MegatronCoreWriter, ANormNamedBothWaysAlreadyIsNotRepeatedAgain) {
  Params p;
  p.add("decoder.layers.0.mlp.linear_fc1.layer_norm_weight", {4});
  p.add("decoder.layers.0.pre_mlp_layernorm.weight", {4});
  p.add("decoder.layers.0.mlp.router.weight", {2, 4});
  WriteLayout l = layout(1, 1, 1, 1);
  l.both_norm_keys = true;
  EXPECT_EQ(plan_torch_dist_write(p.names, p.shapes, {}, l, "u").keys.size(), 3u);
}

void expect_refused(const Params& p, const WriteLayout& l, const std::string& words) {
  try {
    plan_torch_dist_write(p.names, p.shapes, {}, l, "/ckpt/universal");
    ADD_FAILURE() << "accepted; expected an error with: " << words;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(MegatronCoreWriter, RefusesWhatMegatronCouldNotLoadAndSaysWhy) {
  Params p = dense_gpt();
  expect_refused(p, layout(2, 3, 1, 2), "does not divide the 2 layers");
  expect_refused(p, layout(0, 1, 1, 2), "positive");
  expect_refused(p, layout(3, 1, 1, 2), "--tp 3 does not divide");
  Params missing = p;
  missing.names.erase(missing.names.begin() + 4);  // layer 1's qkv
  missing.shapes.erase(missing.shapes.begin() + 4);
  expect_refused(missing, layout(1, 1, 1, 2), "has no parameter for layer 1");
  Params twice = p;
  twice.add("decoder.layers.1.input_layernorm.weight", {4});
  expect_refused(twice, layout(1, 1, 1, 2), "twice");
  Params odd = p;
  odd.shapes[6] = {5};  // layer 1's input_layernorm
  expect_refused(odd, layout(1, 1, 1, 2), "differs from");
  Params beyond = p;
  beyond.add("decoder.layers.7.input_layernorm.weight", {4});
  expect_refused(beyond, layout(1, 1, 1, 2), "layer beyond the 2 layers");
  Params no_layer;
  no_layer.add("decoder.layers.self_attention.linear_qkv.weight", {12, 4});
  expect_refused(no_layer, layout(1, 1, 1, 2), "no layer number");
  Params unknown;
  unknown.add("vision.patch_embed.weight", {4, 4});
  expect_refused(unknown, layout(1, 1, 1, 2), "/ckpt/universal");
}

}  // namespace
}  // namespace megatron_core_writer_test
}  // namespace ucpkit::formats::megatron_core
