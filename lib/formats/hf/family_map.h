// Hugging Face model families as map files (patterns/hf/*.json, compiled in; docs/hf.md): which
// transformers architecture a Megatron-Core model is, the config.json it gets, and per Megatron-Core
// parameter the Hugging Face tensor(s) it becomes (a rename, or a split of Megatron's fused QKV or
// SwiGLU fc1). Plain data; no I/O except read_hf_family().
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucpkit::formats::hf {

inline constexpr const char* kHfMapFormat = "ucpkit-hf-map";

// How one Megatron-Core tensor becomes Hugging Face tensors (rows: dim 0).
enum class Split {
  None,    // one tensor, the same values
  Qkv,     // linear_qkv (per query group [q..., k, v]) -> q_proj, k_proj, v_proj
  GateUp,  // SwiGLU linear_fc1 [W; V] -> gate_proj (W), up_proj (V)
};

// The decoder layers a rule is for, in a model with dense layers between its MoE layers (model fact
// "dense_layers"): every layer, the MoE layers only (router, experts, shared expert), or the dense ones only
// (their MLP).
enum class Layers { All, Moe, Dense };

struct Rule {
  std::vector<std::string> megatron_core;  // name templates ({L}: decoder layer, {E}: expert), any one matching
  std::vector<std::string> hf;             // the Hugging Face name(s): one, or the split's pieces in order
  Split split = Split::None;
  bool vocab = false;                      // vocabulary rows (word embedding, output layer)
  bool optional = false;                   // may be absent from a model (a bias, a tied model's head)
  // The name in the fused expert layout (--hf-experts fused), "" when the rule has none: an expert rule's
  // one tensor per layer, the experts stacked on a new first axis, each whole (no split: gate_up_proj[e]
  // is [gate; up], SwiGLU's fc1 as it is); another rule's other name in that layout (Mixtral's router).
  std::string fused;
  Layers layers = Layers::All;
  // The model fact holding the rows of each piece of a gate_up split ("ffn", "moe_ffn", "shared_ffn");
  // empty: moe_ffn for an expert rule, else ffn.
  std::string ffn;
};

struct Family {
  std::string family;                      // "llama", "qwen2", ...
  std::string origin;                      // "shipped:llama.json" or the file read
  std::string model_type;                  // config.json model_type
  std::vector<std::string> architectures;  // config.json architectures
  // Model facts (model_facts.h) that must hold for this family: {"qk_norm": true, ...}.
  nlohmann::json match = nlohmann::json::object();
  // config.json beyond what every family gets (model_facts.h hf_config): key -> a constant, or
  // "$<fact>" for a model fact's value.
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  // config.json keys that must hold these values (when present) for Megatron-Core to compute the model
  // (Qwen3-MoE's dense layers between MoE layers, for one): an import of another value is refused.
  nlohmann::json requires_config = nlohmann::json::object();
  std::vector<Rule> rules;
  // transformers' named_parameters() order of the model in memory (fused experts, {L} per layer, names a
  // layer lacks skipped): the order DeepSpeed flattens a transformers model's parameters in
  // (formats/hf/engine_plan.h). Empty when the map gives none.
  std::vector<std::string> module_order;

  // Throws Error "<origin>: ..." naming the bad key.
  static Family from_json(const nlohmann::json& j, const std::string& origin);
};

// Reads a map file. Throws Error naming it.
Family read_hf_family(const std::string& path);
// The maps compiled in from patterns/hf/*.json (file name, text), in file-name order.
const std::vector<std::pair<std::string, std::string>>& shipped_hf_map_texts();
std::vector<Family> shipped_hf_families();

struct Matched {
  size_t rule = 0;
  long layer = -1;   // {L}, -1 when the template has none
  long expert = -1;  // {E}, -1 when the template has none
};
// The rule of `family` whose template matches Megatron-Core name `name`, or nullopt.
std::optional<Matched> match_rule(const Family& family, const std::string& name);
// Whether rule `r` is one per expert ({E} in its templates).
bool per_expert(const Rule& r);
// Whether decoder layer `layer` of a model with `facts` (formats/megatron_core/model_facts.h) is an MoE
// layer: the model has experts and the layer is not in facts.dense_layers.
bool moe_layer(const nlohmann::json& facts, long layer);
// Whether rule `r` is for decoder layer `layer` of a model with `facts` (Rule::layers).
bool rule_for_layer(const Rule& r, const nlohmann::json& facts, long layer);
// The model fact of rule `r`'s gate_up rows (Rule::ffn).
std::string ffn_fact(const Rule& r);
// Template `t` with {L} and {E} filled in (a negative value: left as it is).
std::string filled(const std::string& t, long layer, long expert);
// Rule `m`'s Hugging Face names with {L} and {E} filled in.
std::vector<std::string> hf_names(const Family& family, const Matched& m);

}  // namespace ucpkit::formats::hf
