#include "formats/megatron_core/dp_bucket_layout.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>

#include "core/error.h"

namespace ucpkit::formats::megatron_core {

namespace {

struct Parallel {
  int64_t tp = 1, pp = 1, layers = 0;
};

[[noreturn]] void refuse(const Checkpoint& ck, const std::string& why) {
  fail(ck.dcp().metadata().path, "Megatron-Core torch_dist dp_reshardable: " + why);
}

int64_t int_arg(const Checkpoint& ck, const char* name) {
  const auto v = ck.common().arg(name);
  if (!v || !v->is(pickle::Kind::Int)) refuse(ck, std::string("the common state's args has no integer ") + name);
  return v->i;
}

// The layouts handled: one stage per rank with even layer counts, untied embeddings.
Parallel parallel_of(const Checkpoint& ck) {
  Parallel p{int_arg(ck, "tensor_model_parallel_size"), int_arg(ck, "pipeline_model_parallel_size"),
             int_arg(ck, "num_layers")};
  for (const char* unset : {"virtual_pipeline_model_parallel_size", "decoder_first_pipeline_num_layers",
                            "decoder_last_pipeline_num_layers", "num_layers_per_virtual_pipeline_stage"}) {
    const auto v = ck.common().arg(unset);
    if (v && !v->is_none()) refuse(ck, std::string("args.") + unset + " is set (not handled)");
  }
  const auto untie = ck.common().arg("untie_embeddings_and_output_weights");
  if (!untie || !untie->is(pickle::Kind::Bool) || !untie->b) refuse(ck, "tied embeddings are not handled");
  if (p.tp < 1 || p.pp < 1 || p.layers % p.pp != 0) refuse(ck, "num_layers not divisible by the pipeline size");
  return p;
}

// Where a layer's parameter comes in TransformerLayer's registration order (GPT layer spec, local
// modules): input_layernorm (stored as linear_qkv.layer_norm_*), self_attention (linear_proj is
// built before linear_qkv), pre_mlp_layernorm (stored as linear_fc1.layer_norm_*), mlp (router,
// fc1, fc2, shared experts); within a module the weight before the bias, and a module's own parameters
// before its children's (torch's named_parameters: the shared experts' gate_weight, a parameter of
// SharedExpertMLP itself, core_v0.19.0 moe/shared_experts.py:129-134, comes before its linear_fc1 and
// linear_fc2). -1: unknown.
int layer_rank(const std::string& inner) {
  static const std::vector<std::string> order = {
      "self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
      "self_attention.linear_proj.weight",           "self_attention.linear_proj.bias",
      "self_attention.linear_qkv.weight",            "self_attention.linear_qkv.bias",
      "self_attention.q_layernorm.weight",           "self_attention.k_layernorm.weight",
      "mlp.linear_fc1.layer_norm_weight",            "mlp.linear_fc1.layer_norm_bias",
      "pre_mlp_layernorm.weight",                    "mlp.router.weight",
      "mlp.router.expert_bias",                      "mlp.linear_fc1.weight",
      "mlp.linear_fc1.bias",                         "mlp.linear_fc2.weight",
      "mlp.linear_fc2.bias",                         "mlp.shared_experts.gate_weight",
      "mlp.shared_experts.linear_fc1.weight",        "mlp.shared_experts.linear_fc2.weight"};
  for (size_t i = 0; i < order.size(); ++i)
    if (inner == order[i]) return static_cast<int>(i);
  return -1;
}

bool is_expert(const ModelParam& p) { return p.key->model.expert_axis || p.key->model.expert.has_value(); }

// The dense parameters of pipeline stage `stage` in GPTModel registration order.
std::vector<const ModelParam*> stage_params(const Checkpoint& ck, const Parallel& par, int64_t stage) {
  std::vector<const ModelParam*> embedding, decoder_rest, output, out;
  std::map<int64_t, std::vector<const ModelParam*>> layers;
  const int64_t per_stage = par.layers / par.pp;
  for (const auto& p : ck.params()) {
    if (is_expert(p)) continue;
    const ModelKey& m = p.key->model;
    if (!m.head.empty()) {
      const int64_t layer = m.layer_axis ? p.slice.index[0] : *m.layer;
      if (layer / per_stage == stage) layers[layer].push_back(&p);
    } else if (m.key.rfind("embedding.", 0) == 0) {
      if (stage == 0) embedding.push_back(&p);
    } else if (stage == par.pp - 1) {
      (m.key.rfind("decoder.", 0) == 0 ? decoder_rest : output).push_back(&p);
    }
  }
  out = embedding;
  for (auto& [l, ps] : layers) {
    for (const auto* p : ps)
      if (layer_rank(p->key->model.inner) < 0)
        refuse(ck, escaped_brief(p->fqn) + ": a layer parameter of no known registration order");
    std::stable_sort(ps.begin(), ps.end(), [](const ModelParam* a, const ModelParam* b) {
      return layer_rank(a->key->model.inner) < layer_rank(b->key->model.inner);
    });
    out.insert(out.end(), ps.begin(), ps.end());
  }
  out.insert(out.end(), decoder_rest.begin(), decoder_rest.end());  // decoder.final_layernorm
  out.insert(out.end(), output.begin(), output.end());              // then output_layer
  return out;
}

// Rank t's piece of `p` from the model tensor's chunks.
BucketParam local_piece(const Checkpoint& ck, const ModelParam& p, int64_t tp, int64_t t) {
  const auto* e = ck.dcp().metadata().find(p.fqn);
  const size_t lead = p.slice.index.size();
  BucketParam b;
  b.name = p.slice.name;
  b.local_shape = p.slice.shape;
  std::vector<const dcp::Chunk*> mine;
  for (const auto& c : e->chunks)
    if (std::equal(p.slice.index.begin(), p.slice.index.end(), c.offsets.begin())) mine.push_back(&c);
  for (size_t d = 0; d < b.local_shape.size(); ++d) {
    for (const auto* c : mine) {
      if (c->sizes[lead + d] == b.local_shape[d]) continue;
      if (b.dim >= 0 && b.dim != static_cast<int>(d)) refuse(ck, escaped_brief(p.fqn) + " is split on two dimensions");
      b.dim = static_cast<int>(d);
      b.size = c->sizes[lead + d];
    }
  }
  if (b.dim < 0) return b;
  const int64_t pieces = b.local_shape[b.dim] / b.size;
  const bool swiglu = pieces == 2 * tp && p.key->model.inner.find("linear_fc1.") != std::string::npos;
  if (pieces != tp && !swiglu)
    refuse(ck, escaped_brief(p.fqn) + ": " + std::to_string(pieces) + " chunks along the split dimension for TP " +
                   std::to_string(tp));
  b.offsets.push_back(t * b.size);
  if (swiglu) b.offsets.push_back(b.local_shape[b.dim] / 2 + t * b.size);
  b.local_shape[b.dim] = b.size * static_cast<int64_t>(b.offsets.size());
  return b;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

// Lays `pieces` (registration order) out in backprop order with 64-element starts; the end must be
// the bucket's stored length.
void place_reversed(const Checkpoint& ck, const Key& bucket, std::vector<BucketParam>& pieces, BucketLayout& layout) {
  int64_t cursor = 0;
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
    it->start = (cursor + 63) / 64 * 64;
    it->end = it->start + numel_of(it->local_shape);
    cursor = it->end;
    layout.params.push_back(std::move(*it));
  }
  const int64_t stored = ck.dcp().metadata().find(bucket.fqn)->size.at(0);
  if (cursor != stored)
    refuse(ck, escaped_brief(bucket.fqn) + ": the recomputed layout ends at " + std::to_string(cursor) +
                   ", the bucket holds " + std::to_string(stored));
}

// The local experts' parameters of one MoE layer in SequentialMLP's registration order
// (local_experts.{i}.linear_fc1, .linear_fc2, expert by expert). The local backend builds SequentialMLP
// whatever moe_grouped_gemm says (models/backends.py:133-142); TEGroupedMLP's order is not verified.
std::vector<const ModelParam*> moe_layer_experts(const std::vector<const ModelParam*>& layer, int64_t first,
                                                 int64_t count) {
  const auto expert_of = [](const ModelParam* p) {
    return p->key->model.expert_axis ? p->slice.index.back() : *p->key->model.expert;
  };
  std::vector<const ModelParam*> out;
  for (const auto* p : layer)
    if (expert_of(p) >= first && expert_of(p) < first + count) out.push_back(p);
  std::stable_sort(out.begin(), out.end(), [&](const ModelParam* a, const ModelParam* b) {
    const bool fc2a = a->key->model.inner.find("linear_fc2.") != std::string::npos;
    const bool fc2b = b->key->model.inner.find("linear_fc2.") != std::string::npos;
    return std::make_pair(expert_of(a), fc2a) < std::make_pair(expert_of(b), fc2b);
  });
  return out;
}

// What Megatron pads a bucket's end to: lcm(dp, 128), and 2^16 with pad_buckets_for_high_nccl_busbw, dp
// the size of the buffer's DDP group (intra_dp_cp / intra_expt_dp: distributed_data_parallel.py:143-148).
int64_t pad_divisor(const Checkpoint& ck, bool expert) {
  const int64_t dp = expert ? int_arg(ck, "world_size") / (int_arg(ck, "expert_tensor_parallel_size") *
                                                           int_arg(ck, "expert_model_parallel_size") *
                                                           int_arg(ck, "pipeline_model_parallel_size"))
                            : int_arg(ck, "data_parallel_size") * int_arg(ck, "context_parallel_size");
  const auto instances = ck.common().arg("num_distributed_optimizer_instances");
  const int64_t intra = instances && instances->is(pickle::Kind::Int) && instances->i > 0 ? dp / instances->i : dp;
  if (intra < 1) refuse(ck, "the args give a data-parallel size below 1");
  const auto high = ck.common().arg("ddp_pad_buckets_for_high_nccl_busbw");
  return std::lcm(std::lcm(intra, int64_t{128}), high && high->is(pickle::Kind::Bool) && high->b ? 65536 : 1);
}

}  // namespace

std::optional<std::vector<BufferNumels>> buffer_numels(const pickle::Value& v) {
  if (!v.is(pickle::Kind::List)) return std::nullopt;
  std::vector<BufferNumels> out;
  for (const auto& buffer : v.items) {
    if (!buffer->is(pickle::Kind::Dict) || buffer->entries.size() != 1) return std::nullopt;
    const auto& [key, numels] = buffer->entries[0];
    if (!key->is(pickle::Kind::Tuple) || key->items.size() != 2 || !numels->is(pickle::Kind::List)) return std::nullopt;
    BufferNumels b;
    for (const auto& d : key->items) {
      if (!d->is(pickle::Kind::Dtype)) return std::nullopt;
      b.dtypes += (b.dtypes.empty() ? "(torch." : ", torch.") + std::string(dtype_name(d->dtype));
    }
    b.dtypes += ")";
    for (const auto& n : numels->items) {
      if (!n->is(pickle::Kind::Int)) return std::nullopt;
      b.numel.push_back(n->i);
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::string bucket_numel_mismatch(const std::vector<BufferNumels>& saved, bool unpadded,
                                  const std::vector<BucketNumel>& buckets) {
  std::map<int64_t, std::pair<size_t, int64_t>> per_buffer;  // gbuf -> (buckets, sum of layout ends)
  for (const auto& b : buckets) {
    const std::string at = "bucket " + std::to_string(b.bucket) + " of buffer " + std::to_string(b.gbuf);
    if (b.gbuf < 0 || b.gbuf >= static_cast<int64_t>(saved.size()) || b.bucket < 0 ||
        b.bucket >= static_cast<int64_t>(saved[b.gbuf].numel.size()))
      return "no numel of " + at + " (" + std::to_string(saved.size()) + " buffers listed)";
    const BufferNumels& s = saved[b.gbuf];
    if (s.dtypes != b.dtypes)
      return "buffer " + std::to_string(b.gbuf) + " is " + s.dtypes + ", its bucket keys " + b.dtypes;
    const int64_t padded = (b.layout_end + b.pad_divisor - 1) / b.pad_divisor * b.pad_divisor;
    const int64_t want = unpadded ? b.stored : padded;
    if (s.numel[b.bucket] != want)
      return "numel of " + at + ": expected " + std::to_string(want) +
             (unpadded ? " (the stored bucket's length)"
                       : " (the recomputed layout's end " + std::to_string(b.layout_end) + " padded to a multiple of " +
                             std::to_string(b.pad_divisor) + ")") +
             ", stored " + std::to_string(s.numel[b.bucket]);
    auto& [count, ends] = per_buffer[b.gbuf];
    ++count;
    ends += b.layout_end;
  }
  for (size_t g = 0; g < saved.size(); ++g) {
    const auto it = per_buffer.find(static_cast<int64_t>(g));
    const size_t count = it == per_buffer.end() ? 0 : it->second.first;
    if (count != saved[g].numel.size())
      return "buffer " + std::to_string(g) + ": " + std::to_string(saved[g].numel.size()) + " buckets listed, " +
             std::to_string(count) + " stored";
    const int64_t sum = std::accumulate(saved[g].numel.begin(), saved[g].numel.end(), int64_t{0});
    if (unpadded && count > 0 && sum != it->second.second)
      return "numel of buffer " + std::to_string(g) + ": expected " + std::to_string(it->second.second) +
             " (its recomputed layouts' parameters), stored " + std::to_string(sum) + " in all";
  }
  return {};
}

void check_per_bucket_numel(const Checkpoint& ck, const std::vector<BucketLayout>& layouts) {
  std::map<std::pair<int64_t, int64_t>, std::vector<BucketNumel>> groups;  // (chain, dp group) -> buckets
  for (const auto& l : layouts) {
    const Key& k = *l.bucket;
    groups[{k.chain, k.bucket.dp_group_idx}].push_back(
        {k.bucket.gbuf_idx, k.bucket.bucket_idx, k.bucket.dtypes, l.params.empty() ? 0 : l.params.back().end,
         ck.dcp().metadata().find(k.fqn)->size.at(0), pad_divisor(ck, k.chain > 0)});
  }
  for (const auto& [group, buckets] : groups) {
    const std::string prefix = (group.first >= 0 ? "chained_" + std::to_string(group.first) + "." : "") +
                               "optimizer.distributed.dp_group_idx_" + std::to_string(group.second) + ".";
    for (const bool unpadded : {false, true}) {
      const std::string object = prefix + (unpadded ? "per_bucket_numel_unpadded" : "per_bucket_numel");
      const auto key = std::find_if(ck.keys().begin(), ck.keys().end(),
                                    [&](const Key& k) { return k.kind == KeyKind::Object && k.object == object; });
      if (key == ck.keys().end()) refuse(ck, "no ShardedObject " + object);
      const auto& item = ck.dcp().metadata().item_of(key->fqn, nullptr).storage;
      const std::string file = (std::filesystem::path(ck.dir()) / item.relative_path).string();
      const auto saved = buffer_numels(*ck.read_object(key->fqn));
      const std::string why = saved ? bucket_numel_mismatch(*saved, unpadded, buckets)
                                    : "not a list of {(param dtype, grad dtype): [numel per bucket]}";
      if (!why.empty())
        fail(file, "Megatron-Core torch_dist dp_reshardable: " + escaped_brief(key->fqn, 200) + ": " + why);
    }
  }
}

std::vector<BucketLayout> expert_bucket_layouts(const Checkpoint& ck) {
  if (ck.optimizer_format() != OptimizerFormat::DpReshardable) refuse(ck, "the checkpoint has no dp_reshardable buckets");
  const Parallel par = parallel_of(ck);
  const int64_t ep = int_arg(ck, "expert_model_parallel_size"), experts = int_arg(ck, "num_experts");
  const int64_t etp = int_arg(ck, "expert_tensor_parallel_size");
  if (etp < 1) refuse(ck, "args.expert_tensor_parallel_size below 1");
  if (ep < 1 || experts % ep != 0) refuse(ck, "num_experts not divisible by the expert-parallel size");
  const auto impl = ck.common().arg("transformer_impl");
  if (!impl || !impl->is(pickle::Kind::Str) || impl->s != "local")
    refuse(ck, "expert buffers are unflattened for transformer_impl local (SequentialMLP) only");
  const int64_t local = experts / ep, per_stage = par.layers / par.pp;
  std::vector<BucketLayout> out;
  for (const Key* k : ck.buckets()) {
    if (k->state != "param" || k->chain != 1) continue;
    if (k->bucket.gbuf_idx != 0 || k->bucket.bucket_idx != 0)
      refuse(ck, escaped_brief(k->fqn) + ": several buffers or buckets are not handled");
    // The expert model-parallel rank: its rank in the tp-ep-pp group of the expert grid (expert TP fastest,
    // then EP, then the stage: optimizer/__init__.py:1198, parallel_state.py:1419 at core_v0.19.0).
    const int64_t g = k->bucket.dp_group_idx;
    BucketLayout layout{k, g % etp, g / (etp * ep), {}};
    const int64_t ep_rank = g / etp % ep;
    std::map<int64_t, std::vector<const ModelParam*>> layers;
    for (const auto& p : ck.params()) {
      if (!is_expert(p)) continue;
      const int64_t layer = p.key->model.layer_axis ? p.slice.index[0] : *p.key->model.layer;
      if (layer / per_stage == layout.pp_stage) layers[layer].push_back(&p);
    }
    std::vector<BucketParam> pieces;
    for (const auto& [l, ps] : layers)
      for (const auto* p : moe_layer_experts(ps, ep_rank * local, local))
        pieces.push_back(local_piece(ck, *p, etp, layout.tp_rank));
    place_reversed(ck, *k, pieces, layout);
    out.push_back(std::move(layout));
  }
  return out;
}

std::vector<BucketLayout> dense_bucket_layouts(const Checkpoint& ck) {
  if (ck.optimizer_format() != OptimizerFormat::DpReshardable) refuse(ck, "the checkpoint has no dp_reshardable buckets");
  const Parallel par = parallel_of(ck);
  std::vector<BucketLayout> out;
  for (const Key* k : ck.buckets()) {
    if (k->state != "param" || k->chain > 0) continue;  // chained_1...: expert buffers, not handled
    if (k->bucket.gbuf_idx != 0 || k->bucket.bucket_idx != 0)
      refuse(ck, escaped_brief(k->fqn) + ": several buffers or buckets are not handled");
    const int64_t g = k->bucket.dp_group_idx;
    if (g >= par.tp * par.pp) refuse(ck, escaped_brief(k->fqn) + ": dp group beyond TP x PP");
    BucketLayout layout{k, g % par.tp, g / par.tp, {}};
    const auto owned = stage_params(ck, par, layout.pp_stage);
    std::vector<BucketParam> pieces;
    for (const auto* p : owned) pieces.push_back(local_piece(ck, *p, par.tp, layout.tp_rank));
    place_reversed(ck, *k, pieces, layout);
    out.push_back(std::move(layout));
  }
  return out;
}

Tensor bucket_param(const Tensor& bucket_state, const BucketParam& p) {
  return bucket_state.narrow(0, p.start, p.end - p.start).contiguous().reshape(p.local_shape);
}

Tensor tp_local_piece(const Tensor& global_param, const BucketParam& p) {
  if (p.dim < 0) return global_param;
  std::vector<Tensor> parts;
  for (const auto o : p.offsets) parts.push_back(global_param.narrow(p.dim, o, p.size));
  return cat(parts, p.dim);
}

}  // namespace ucpkit::formats::megatron_core
