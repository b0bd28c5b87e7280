// A fresh Megatron-DeepSpeed GPTModelPipe run's layout and model file (gpt_pipe.h).
#include "formats/deepspeed/gpt_pipe.h"

#include "formats/deepspeed/model_states.h"
#include "patterns/pattern_set.h"

namespace ucpkit::formats::deepspeed {

using nlohmann::json;
using pickle::Value;
using pickle::ValuePtr;

namespace {

constexpr int kFirstBlock = 2;           // specs[0] a function, specs[1] the embedding

// Plain JSON as pickle values: objects -> dicts, arrays -> lists.
ValuePtr to_value(const json& j) {
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_integer()) return Value::integer(j.get<int64_t>());
  if (j.is_number()) return Value::real(j.get<double>());
  if (j.is_string()) return Value::str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<ValuePtr> items;
    for (const auto& x : j) items.push_back(to_value(x));
    return Value::list(std::move(items));
  }
  if (j.is_object()) {
    auto d = Value::dict();
    for (const auto& [k, x] : j.items()) d->set_item(k, to_value(x));
    return d;
  }
  return Value::none();
}

}  // namespace

GptPipeLayout gpt_pipe_layout(const GptPipeModel& m) {
  GptPipeLayout l;
  const int64_t H = m.hidden, F = m.ffn, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  const int final_norm = kFirstBlock + static_cast<int>(m.layers), head = final_norm + 1;
  l.padded_vocab = (m.vocab + kGptPipeVocabMultiple - 1) / kGptPipeVocabMultiple * kGptPipeVocabMultiple;
  auto add = [&](int layer, const std::string& local, std::vector<int64_t> shape, bool listed = true) {
    l.layer_keys[layer].push_back(local);
    if (listed) l.params.emplace_back((m.tied && layer == 1 ? "tied_modules.embed." : std::to_string(layer) + ".") + local, shape);
  };
  add(1, "word_embeddings.weight", {m.vocab, H});
  for (int64_t b = kFirstBlock; b < final_norm; ++b) {
    const int layer = static_cast<int>(b);
    add(layer, "input_layernorm.weight", {H});
    add(layer, "self_attention.query_key_value.weight", {q + 2 * kv, H});
    add(layer, "self_attention.dense.weight", {H, q});
    add(layer, "post_attention_layernorm.weight", {H});
    add(layer, "mlp.dense_h_to_4h.weight", {2 * F, H});
    add(layer, "mlp.dense_4h_to_h.weight", {H, F});
  }
  add(final_norm, "weight", {H});
  if (m.tied) add(head, "word_embeddings.weight", {m.vocab, H}, false);  // the tied embedding again, on the last stage
  else add(head, "lm_head.weight", {m.vocab, H});

  l.numbering.embedding = m.tied ? 1 : -1;  // only a tied module has a layer file outside the numbered names
  l.numbering.tied_head = m.tied ? head : -1;
  l.numbering.first_block = kFirstBlock;
  l.numbering.last_block = final_norm - 1;
  l.numbering.final_norm = final_norm;
  l.numbering.origin = "checkpoint";

  // gpt_model.py:84-185 with the fused QKV as [Q; K; V] sub-parameters (split per TP rank as the layer holds them).
  using patterns::Category;
  using patterns::Pattern;
  auto& set = l.checkpoint_patterns;
  set.version = 0.2;
  set.original_vocab_size = m.vocab;
  set.padded_vocab_size = l.padded_vocab;
  set.origin = "checkpoint";
  auto list = [&](Category c) -> std::vector<Pattern>& { return set.lists[static_cast<int>(c)]; };
  if (m.tied) {
    list(Category::Vocabulary) = {Pattern("tied_modules.embed.word_embeddings.weight")};
    list(Category::PipelineReplicated) = list(Category::Vocabulary);
  } else {
    list(Category::Vocabulary) = {Pattern("\\d+.word_embeddings.weight"), Pattern("\\d+.lm_head.weight")};
  }
  list(Category::TpReplicated) = {Pattern("\\d+.input_layernorm.weight"), Pattern("\\d+.post_attention_layernorm.weight"),
                                  Pattern("\\d+.weight")};
  list(Category::RowParallel) = {Pattern("\\d+.mlp.dense_4h_to_h.weight"), Pattern("\\d+.self_attention.dense.weight")};
  list(Category::TwoSubParamsCatDim0) = {Pattern("\\d+.mlp.dense_h_to_4h.weight")};
  patterns::SubParamSpec qkv_spec;
  qkv_spec.patterns = {"\\d+.self_attention.query_key_value.weight"};
  qkv_spec.shape = {q + 2 * kv, -1};
  qkv_spec.sub_sizes = {q, kv, kv};
  set.sub_params = {qkv_spec};
  set.sub_param_patterns = {{Pattern(qkv_spec.patterns.front())}};
  return l;
}

ValuePtr fresh_gpt_pipe_model_states(const GptPipeModel& m, const GptPipeLayout& l, const ValuePtr& args,
                                     const std::string& ds_version) {
  ParamShapes shapes(2);
  for (const auto& [name, shape] : l.params) shapes[shape.size() > 1 ? 0 : 1].emplace_back(name, shape);
  auto ms = fresh_engine_model_states(shapes, m.dtype, 1, ds_version);
  ms.module.clear();
  ms.tree = nullptr;
  for (auto& [k, v] : ms.entries)
    if (k == "module") v = Value::none();
  ms.set("args", args);
  ms.set("checkpoint_version", Value::real(3.0));
  ms.set("iteration", Value::integer(0));
  ms.set("tokens", Value::integer(0));
  ms.set("universal_checkpoint_info", to_value(l.checkpoint_patterns.to_json()));
  return to_pickle(ms);
}

}  // namespace ucpkit::formats::deepspeed
