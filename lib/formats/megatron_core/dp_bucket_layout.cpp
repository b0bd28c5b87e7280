#include "formats/megatron_core/dp_bucket_layout.h"

#include <algorithm>
#include <map>

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
// fc1, fc2, shared experts); within a module the weight before the bias. -1: unknown.
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
      "mlp.linear_fc2.bias",                         "mlp.shared_experts.linear_fc1.weight",
      "mlp.shared_experts.linear_fc2.weight",        "mlp.shared_experts.gate_weight"};
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

}  // namespace

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
    int64_t cursor = 0;
    for (auto it = owned.rbegin(); it != owned.rend(); ++it) {  // backprop order
      BucketParam b = local_piece(ck, **it, par.tp, layout.tp_rank);
      b.start = (cursor + 63) / 64 * 64;
      b.end = b.start + numel_of(b.local_shape);
      cursor = b.end;
      layout.params.push_back(std::move(b));
    }
    const int64_t stored = ck.dcp().metadata().find(k->fqn)->size.at(0);
    if (cursor != stored)
      refuse(ck, escaped_brief(k->fqn) + ": the recomputed layout ends at " + std::to_string(cursor) +
                     ", the bucket holds " + std::to_string(stored));
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
