// What --format hf writes, planned from the Megatron-Core names and shapes alone (plain data, printable
// as JSON, unit-tested without I/O): every Hugging Face tensor with the Megatron-Core parameter and rows
// it comes from, the safetensors shards, config.json. Every parameter maps to at least one tensor and
// every Hugging Face name is written once, or the plan is an Error naming the parameter.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/hf/family_map.h"
#include "io/dtype.h"

namespace ucpkit::formats::hf {

struct Piece {
  std::string name;             // Hugging Face name
  std::vector<int64_t> shape;   // its shape
  size_t param = 0;             // the Megatron-Core parameter (index into the input's names)
  Split split = Split::None;    // Qkv: rows taken after the regroup to [Q; K; V]
  int64_t row0 = 0, rows = 0;   // dim-0 rows [row0, row0 + rows) of that value
  // --hf-experts fused: the parameters (experts 0..E-1) stacked on a new first axis, each whole; `param`
  // is the first. Empty otherwise.
  std::vector<size_t> stack;

  // The parameters written into this tensor, in order: the stack, or `param` alone.
  std::vector<size_t> params() const { return stack.empty() ? std::vector<size_t>{param} : stack; }
};

struct ExportInput {
  std::vector<std::string> names;            // Megatron-Core names
  std::vector<std::vector<int64_t>> shapes;  // their shapes
  int64_t vocab = 0;                         // vocabulary rows kept (0: every row of the vocabulary tensors)
};

struct ExportPlan {
  std::string family, origin;
  std::vector<Piece> tensors;                 // in file order
  std::vector<std::vector<size_t>> shards;    // indices into tensors, per file
  std::vector<std::string> files;             // model.safetensors, or model-0000k-of-0000n.safetensors
  nlohmann::ordered_json config;
  int64_t vocab = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // the QKV split
  DType dtype = DType::Float32;

  uint64_t bytes() const;  // tensor bytes in all
  nlohmann::json to_json() const;
};

// `facts`: formats/megatron_core/model_facts (the derived ones are added here). `where` names the input
// in errors. shard_bytes: a file holds tensors up to this many bytes (one larger tensor alone).
// fused_experts: MoE experts in the fused layout (Rule::fused), else per expert.
ExportPlan plan_hf_export(const std::vector<Family>& families, const nlohmann::json& facts, const ExportInput& in,
                          DType dtype, uint64_t shard_bytes, const std::string& where, bool fused_experts = false);

}  // namespace ucpkit::formats::hf
