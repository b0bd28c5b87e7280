// A fresh Megatron-DeepSpeed GPT run's layout and model file (megatron_gpt.h).
#include "formats/deepspeed/megatron_gpt.h"

#include <unordered_map>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/model_states.h"

namespace ucpkit::formats::deepspeed {

using nlohmann::json;
using patterns::Category;
using patterns::Pattern;
using pickle::Value;
using pickle::ValuePtr;

namespace {

constexpr int kFirstBlock = 2;  // GPTModelPipe: specs[0] a function, specs[1] the embedding
constexpr const char* kBlocks = "language_model.encoder.layers.";
constexpr const char* kExperts = "mlp.deepspeed_moe.experts.deepspeed_experts.";

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

// GPTModelPipe's layers: the parameters, each layer file's keys, the numbering.
void pipe_params(const MegatronGpt& m, MegatronGptLayout& l) {
  const int64_t H = m.hidden, F = m.ffn, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  const int final_norm = kFirstBlock + static_cast<int>(m.layers), head = final_norm + 1;
  auto add = [&](int layer, const std::string& local, std::vector<int64_t> shape, bool listed = true) {
    l.layer_keys[layer].push_back(local);
    if (listed) l.params.push_back({(m.tied && layer == 1 ? "tied_modules.embed." : std::to_string(layer) + ".") + local, shape});
  };
  add(1, "word_embeddings.weight", {m.vocab, H});
  for (int layer = kFirstBlock; layer < final_norm; ++layer) {
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
}

// GPTModel with native MoE in every layer: the module's parameters in registration order, each layer's experts after
// its gate.
void moe_params(const MegatronGpt& m, MegatronGptLayout& l) {
  const int64_t H = m.hidden, F = m.ffn, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  l.params.push_back({"language_model.embedding.word_embeddings.weight", {m.vocab, H}});
  for (int layer = 0; layer < m.layers; ++layer) {
    const std::string p = kBlocks + std::to_string(layer) + ".";
    l.params.push_back({p + "input_layernorm.weight", {H}});
    l.params.push_back({p + "self_attention.query_key_value.weight", {q + 2 * kv, H}});
    l.params.push_back({p + "self_attention.dense.weight", {H, q}});
    l.params.push_back({p + "post_attention_layernorm.weight", {H}});
    l.params.push_back({p + "mlp.deepspeed_moe.gate.wg.weight", {m.experts, H}});
    for (int e = 0; e < m.experts; ++e) {
      const std::string x = p + kExperts + std::to_string(e) + ".";
      l.params.push_back({x + "dense_h_to_4h.weight", {2 * F, H}, layer, e});
      l.params.push_back({x + "dense_4h_to_h.weight", {H, F}, layer, e});
    }
    l.num_experts.push_back(static_cast<int>(m.experts));
  }
  l.params.push_back({"language_model.encoder.final_layernorm.weight", {H}});
  if (!m.tied) l.params.push_back({"language_model.output_layer.weight", {m.vocab, H}});
}

// gpt_model.py:84-185 with the fused QKV as [Q; K; V] sub-parameters (split per TP rank as the layer holds them).
void checkpoint_patterns(const MegatronGpt& m, MegatronGptLayout& l) {
  auto& set = l.checkpoint_patterns;
  set.version = 0.2;
  set.original_vocab_size = m.vocab;
  set.padded_vocab_size = l.padded_vocab;
  set.origin = "checkpoint";
  auto list = [&](Category c) -> std::vector<Pattern>& { return set.lists[static_cast<int>(c)]; };
  const std::string b = l.pipeline ? "\\d+." : std::string(kBlocks) + "\\d+.";
  if (l.pipeline && m.tied) {
    list(Category::Vocabulary) = {Pattern("tied_modules.embed.word_embeddings.weight")};
    list(Category::PipelineReplicated) = list(Category::Vocabulary);
  } else if (l.pipeline) {
    list(Category::Vocabulary) = {Pattern("\\d+.word_embeddings.weight"), Pattern("\\d+.lm_head.weight")};
  } else {
    list(Category::Vocabulary) = {Pattern("language_model.embedding.word_embeddings.weight")};
    if (!m.tied) list(Category::Vocabulary).emplace_back("language_model.output_layer.weight");
  }
  auto& replicated = list(Category::TpReplicated);
  replicated = {Pattern(b + "input_layernorm.weight"), Pattern(b + "post_attention_layernorm.weight"),
                Pattern(l.pipeline ? "\\d+.weight" : "language_model.encoder.final_layernorm.weight")};
  const std::string mlp = l.pipeline ? b + "mlp." : b + kExperts + "\\d+.";
  if (!l.pipeline) replicated.emplace_back(b + "mlp.deepspeed_moe.gate.wg.weight");
  list(Category::RowParallel) = {Pattern(mlp + "dense_4h_to_h.weight"), Pattern(b + "self_attention.dense.weight")};
  list(Category::TwoSubParamsCatDim0) = {Pattern(mlp + "dense_h_to_4h.weight")};
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  patterns::SubParamSpec qkv;
  qkv.patterns = {b + "self_attention.query_key_value.weight"};
  qkv.shape = {q + 2 * kv, -1};
  qkv.sub_sizes = {q, kv, kv};
  set.sub_params = {qkv};
  set.sub_param_patterns = {{Pattern(qkv.patterns.front())}};
}

// Megatron's nested module of `params` (module_tree.h's flat names): language_model -> embedding -> word_embeddings
// -> weight, encoder -> its flat keys (ParallelTransformer's state_dict), output_layer -> weight.
ValuePtr megatron_module(const std::vector<std::pair<std::string, ValuePtr>>& params) {
  auto root = Value::dict(true);
  auto child = [](const ValuePtr& d, const std::string& key) {
    if (auto c = d->get(key)) return c;
    auto c = Value::dict(true);
    d->set_item(key, c);
    return c;
  };
  for (const auto& [name, value] : params) {
    std::vector<std::string> parts;
    size_t at = 0;
    for (int i = 0; i < 2; ++i) {  // language_model, then embedding / encoder / output_layer
      const size_t dot = name.find('.', at);
      parts.push_back(name.substr(at, dot - at));
      at = dot + 1;
    }
    ValuePtr d = child(child(root, parts[0]), parts[1]);
    std::string rest = name.substr(at);
    if (parts[1] != "encoder")
      for (size_t dot; (dot = rest.find('.')) != std::string::npos; rest = rest.substr(dot + 1)) d = child(d, rest.substr(0, dot));
    d->set_item(rest, value);
  }
  return root;
}

}  // namespace

MegatronGptLayout megatron_gpt_layout(const MegatronGpt& m) {
  MegatronGptLayout l;
  l.pipeline = m.experts == 0;
  l.padded_vocab = (m.vocab + kGptVocabMultiple - 1) / kGptVocabMultiple * kGptVocabMultiple;
  if (l.pipeline) pipe_params(m, l);
  else moe_params(m, l);
  checkpoint_patterns(m, l);
  return l;
}

ValuePtr fresh_megatron_gpt_model_states(const MegatronGpt& m, const MegatronGptLayout& l, const ValuePtr& args,
                                         const std::string& ds_version) {
  ParamShapes shapes(l.pipeline ? 2 : 3);
  for (const auto& p : l.params) shapes[p.expert >= 0 ? 2 : p.shape.size() > 1 ? 0 : 1].emplace_back(p.name, p.shape);
  auto ms = fresh_engine_model_states(shapes, m.dtype, 1, ds_version);
  // The module holds the dense parameters in module order (the experts have files of their own).
  std::vector<std::pair<std::string, ValuePtr>> dense;
  if (!l.pipeline) {
    const std::unordered_map<std::string, ValuePtr> placeholder(ms.module.begin(), ms.module.end());
    for (const auto& p : l.params)
      if (p.expert < 0) dense.emplace_back(p.name, placeholder.at(p.name));
  }
  ms.module = dense;
  ms.tree = l.pipeline ? nullptr : megatron_module(dense);
  for (auto& [k, v] : ms.entries)
    if (k == "module" && l.pipeline) v = Value::none();
  if (!l.pipeline) ms.set("num_experts", to_value(l.num_experts));
  ms.set("args", args);
  ms.set("checkpoint_version", Value::real(3.0));
  ms.set("iteration", Value::integer(0));
  ms.set("tokens", Value::integer(0));
  ms.set("universal_checkpoint_info", to_value(l.checkpoint_patterns.to_json()));
  return to_pickle(ms);
}

}  // namespace ucpkit::formats::deepspeed
