// The name and layout mapping between a Megatron-DeepSpeed universal folder (ucp-union of a DeepSpeed /
// Megatron-DeepSpeed checkpoint) and a Megatron-Core-named one (docs/formats-megatron-core.md,
// "Universal names"), as plain data: one map per model family (patterns/megatron-core/*.json, compiled
// in), each rule a Megatron-DeepSpeed name pattern (GPTModel and GPTModelPipe spellings) -> a
// Megatron-Core name and a layout transform. The facts, with file:line: docs/megatron-core-mapping.md.
// Pure: no I/O except read_model_map().
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/tensor.h"

namespace ucpkit::formats::megatron_core {

inline constexpr const char* kModelMapFormat = "ucpkit-megatron-core-map";

// How the tensor's rows differ between the two namings.
enum class MapLayout {
  Identity,  // the same tensor
  Qkv,       // fused QKV: [Q; K; V] (a sub-params join) <-> Megatron-Core's per-query-group order
  Fc1,       // MLP fc1: the same [W_all; V_all] rows, checked to be TP-independent
};

struct MapRule {
  // Megatron-DeepSpeed name patterns with placeholders {L} (decoder layer, 0-based), {B} (the
  // PipelineModule layer index of block L), {F} (the final norm's layer index), {H} (the untied head's
  // layer index) and {E} (global expert id); each a full-name match.
  std::vector<std::string> deepspeed;
  std::string megatron_core;  // placeholders {L} and {E}
  MapLayout layout = MapLayout::Identity;
};

struct ModelMap {
  std::string family;  // "gpt", "llama-gqa-swiglu", "deepspeed-moe"
  std::string origin;  // the file it came from, or "shipped:<name>"
  std::vector<MapRule> rules;
  nlohmann::json json;  // as read (recorded in the Megatron-Core-named manifest)

  // Throws Error "<origin>: ..." naming the bad key.
  static ModelMap from_json(const nlohmann::json& j, const std::string& origin);
};

// Reads a map file (patterns/megatron-core/<family>.json). Throws Error naming it.
ModelMap read_model_map(const std::string& path);

// The maps compiled in from patterns/megatron-core/*.json (file name, text), in file-name order.
const std::vector<std::pair<std::string, std::string>>& shipped_model_map_texts();
std::vector<ModelMap> shipped_model_maps();

// PipelineModule numbering of the source (manifest source.pipeline_numbering); all -1 for GPTModel names.
struct PipeNumbering {
  int first_block = -1, final_norm = -1, head = -1;
};

struct MappedName {
  std::string name;  // Megatron-Core name
  size_t rule = 0;   // index into ModelMap::rules
  int layer = -1;    // decoder layer, -1 when the name has none
  int expert = -1;   // global expert id, -1 when none
};

// The Megatron-Core name of a Megatron-DeepSpeed universal name, or nullopt when no rule matches.
std::optional<MappedName> to_megatron_core(const ModelMap& map, const std::string& deepspeed_name,
                                           const PipeNumbering& numbering);

// Fused QKV rows (dim 0; a weight [rows, hidden] or a bias [rows]). heads = query heads, groups = query
// groups (KV heads), head_dim = rows per head; rows = (heads + 2 * groups) * head_dim.
struct QkvShape {
  int64_t heads = 0, groups = 0, head_dim = 0;
};
// [Q; K; V] (all query heads, all key heads, all value heads) -> Megatron-Core's order: per query
// group g, its heads/groups query heads, then its key head, then its value head
// (megatron/core/transformer/attention.py:1860-1900 at core_v0.19.0). Throws Error when rows disagree.
Tensor qkv_split_to_grouped(const Tensor& t, const QkvShape& s);
// The inverse.
Tensor qkv_grouped_to_split(const Tensor& t, const QkvShape& s);
// A run of `rows` rows of an output at row `out`, taken from rows [in, in + rows) of an input.
struct RowRun {
  int64_t out = 0, in = 0, rows = 0;
};
// qkv_grouped_to_split as row runs, in output order, for a value of `dims` dimensions and `rows` rows
// (readers of element ranges move rows instead of tensors). Throws Error as qkv_grouped_to_split does.
std::vector<RowRun> qkv_grouped_to_split_rows(size_t dims, int64_t rows, const QkvShape& s);

}  // namespace ucpkit::formats::megatron_core
