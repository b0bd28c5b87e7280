// What a Hugging Face folder becomes in Megatron-Core names (ucp-union --input <hf folder>, docs/hf.md),
// planned from config.json and the tensors' names and shapes alone (plain data, unit-tested without I/O):
// the family from config.json's architectures, the model facts (formats/megatron_core/model_facts.h terms)
// from config.json, and per Megatron-Core parameter the Hugging Face tensors it is made of (the export
// map read backwards: q/k/v_proj into linear_qkv per query group, gate/up_proj into linear_fc1). Every
// tensor is used once; one the map does not name, a split with a piece missing, an architecture without
// a map, a config contradicting the tensors: Error naming the file and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/hf/family_map.h"
#include "io/dtype.h"

namespace ucpkit::formats::hf {

struct TensorShape {
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;
};

struct ImportParam {
  std::string name;                  // Megatron-Core name
  std::vector<int64_t> shape;        // its shape
  DType dtype = DType::Float32;      // the model dtype (its pieces')
  Split merge = Split::None;         // how the pieces join (rows, dim 0)
  std::vector<std::string> sources;  // the Hugging Face tensors, in the split's order
  int64_t index = -1;                // >= 0: element `index` of the one source's first axis (fused experts)
};

struct ImportPlan {
  std::string family, origin;
  nlohmann::json facts;                  // model facts, from config.json
  std::vector<ImportParam> params;       // in the map's order, layers ascending
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  DType dtype = DType::Float32;          // the model dtype (config.json's, else the tensors')
  nlohmann::json to_json() const;
};

// The model facts a config.json states (hidden size, heads, ...); Error naming `config_path` and the key
// when a needed one is missing or states math the Megatron-Core model cannot compute.
nlohmann::json facts_from_config(const nlohmann::json& config, const Family& family, const std::string& config_path);

// Experts per MoE layer among Megatron-Core parameter names ({"<layer>": distinct experts}, empty for a dense
// model): what an audit (docs/hf.md "Audit") records so that a dropped expert shows.
nlohmann::json experts_per_layer(const std::vector<std::string>& megatron_core_names);

ImportPlan plan_hf_import(const std::vector<Family>& families, const nlohmann::json& config,
                          const std::map<std::string, TensorShape>& tensors, const std::string& dir);

}  // namespace ucpkit::formats::hf
