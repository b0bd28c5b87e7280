// DeepSpeed's PipelineModule partition methods: which layers of a PipelineModule's layer list each
// pipeline stage builds, exactly as DeepSpeed computes it (deepspeed/runtime/pipe/module.py
// _partition_layers, v0.14.5 :387-412, v0.19.6 :396-421; deepspeed/runtime/utils.py partition_uniform
// and partition_balanced, v0.14.5 :562-634, v0.19.6 :606-678, the same text), plus the per-layer
// parameter sizes read from a checkpoint's layer files. Pure functions but the reader; plain data.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ucpkit::formats::deepspeed {

// PipelineModule(partition_method=...): 'parameters' (DeepSpeed's default), 'uniform', 'type:<regex>'.
// DeepSpeed lowercases the method first (module.py v0.19.6 :403), so the regex is lowercased too, and
// matched case-insensitively (:324). 'profile' and anything else: UsageError naming --partition-method
// (DeepSpeed raises NotImplementedError, :418-421).
struct PartitionMethod {
  enum class Kind { Parameters, Uniform, Type } kind = Kind::Parameters;
  std::string type_regex;  // Kind::Type: the text after "type:"
};
PartitionMethod parse_partition_method(const std::string& text);
std::string to_string(const PartitionMethod& m);

// utils.py partition_uniform: num_parts + 1 bounds; items <= parts gives min(p, items), else chunks
// of num_items / num_parts with the first residual parts one larger.
std::vector<int64_t> partition_uniform(int64_t num_items, int num_parts);
// utils.py partition_balanced: the dynamic program that minimises (largest part - smallest part), ties
// going to the later split (`if dp_cost[i, j] >= cost`), in float64 as numpy computes it; n <= parts
// falls back to partition_uniform.
std::vector<int64_t> partition_balanced(const std::vector<int64_t>& weights, int num_parts);

// One entry of the PipelineModule's layer list, as far as partitioning needs it.
struct PipelineLayer {
  int64_t params = 0;                    // trainable parameter elements (_count_layer_params, module.py v0.19.6 :303-320)
  std::optional<std::string> type_name;  // the layer's class name (LayerSpec typename, module class, function __name__)
};
// ucp-load --layer-types FILE: the PipelineModule's layer list by class name, one name a line in order, as
// DeepSpeed's _find_layer_type names each entry of _layer_specs for type:<regex> (module.py v0.14.5 :313-328,
// v0.19.5 :322-337): a LayerSpec (TiedLayerSpec too) its typename.__name__, a module its class name, a
// function its __name__. A checkpoint's files hold none of these. Printed in the training job with
//   [s.typename.__name__ if isinstance(s, LayerSpec) else type(s).__name__ if isinstance(s, torch.nn.Module)
//    else s.__name__ for s in model._layer_specs]
// (one per line). Trailing spaces and a '\r' are dropped; an empty line, or no line, is an Error naming
// the file and the line; an unreadable file an Error naming it.
std::vector<std::string> read_layer_types(const std::string& path);

// _partition_layers: the stage bounds (parts[s] .. parts[s + 1] - 1 are stage s's layers) of `layers`
// over `stages`. type:<regex> needs every layer's type name (a checkpoint's files do not hold them:
// Error naming the first layer without one and --layer-types, the option that supplies them); no match
// is DeepSpeed's RuntimeError (:339-340), an Error.
std::vector<int64_t> partition_layers(const PartitionMethod& method, const std::vector<PipelineLayer>& layers, int stages);

// The trainable elements of every layer file layer_LL-model_TT-model_states.pt of tensor-parallel rank
// `tp` in `step_dir` (the layer's state dict: pipe/module.py save_state_dict writes layer.state_dict()
// for every layer with one, v0.19.6 :607-642, file name ckpt_layer_path :588-596; a function layer has no file): layer index -> the sum of
// numel over the keys `is_param(layer, key)` accepts (a buffer is in the state dict, not in the count).
std::map<int, int64_t> layer_file_params(const std::string& step_dir, int tp,
                                         const std::function<bool(int layer, const std::string& key)>& is_param);

}  // namespace ucpkit::formats::deepspeed
