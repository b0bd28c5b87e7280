// Expert loads (tokens per expert per MoE layer) and the readers for the formats training jobs emit.
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace ucpkit::placement {

// A [layers][experts] matrix of non-negative, finite token counts.
struct LoadMatrix {
  size_t layers = 0;
  size_t experts = 0;
  std::vector<double> values;  // row-major

  std::span<const double> layer(size_t l) const { return {values.data() + l * experts, experts}; }
  std::vector<double> layer_vector(size_t l) const {
    return {values.begin() + l * experts, values.begin() + (l + 1) * experts};
  }
  double at(size_t l, size_t e) const { return values[l * experts + e]; }
};

struct LoadFileOptions {
  // Moving average over the last `window` snapshots (0: all); inputs with one snapshot ignore it.
  size_t window = 1;
  // Pick one snapshot by its key (an "iterations" key or a trace "iteration"); empty: the latest.
  std::string snapshot;
  // Number of experts for router traces whose highest expert id may never be routed to (0: infer).
  size_t experts = 0;
};

// Reads loads from a file; the format follows the extension (.csv, .jsonl) or the content:
//  * JSON matrix [layers][experts], or snapshots [snapshot][layers][experts];
//  * JSON object with "weight" (EPLB example), "loads", "logical_count" (SGLang/vLLM dump, 2-D or
//    3-D with a leading buffer dimension) or "iterations" {key: matrix} (SmartMoE trace);
//  * CSV: one row per layer, one column per expert, optional header (a leading "layer" column is dropped);
//  * router trace JSONL (io/router_trace.h, the parser pec-save uses too): one snapshot per "iteration";
//  * .pt (SGLang expert-distribution dump) and .safetensors (vLLM EPLB load window):
//    engine_formats.h, read_engine_loads (window and snapshot options do not apply).
// Throws Error naming the file on malformed, ragged, negative or non-finite input.
LoadMatrix read_loads(const std::string& path, const LoadFileOptions& options = {});
// The same, from text already in memory; `name` is used in messages and to pick the format.
LoadMatrix parse_loads(const std::string& text, const std::string& name, const LoadFileOptions& options = {});

// Checks shape and values; throws Error("<name>: ...").
void validate_loads(const LoadMatrix& loads, const std::string& name);

}  // namespace ucpkit::placement
