// A transformers model's parameters as they are in memory, in the order the DeepSpeed engine around it
// flattens them (plain data, no I/O): the names of the fused expert layout (transformers 5 keeps
// Mixtral's and the Qwen MoE experts as one gate_up_proj [E, 2I, H] and one down_proj [E, H, I] per layer),
// sorted by the family map's module_order (transformers' named_parameters order). ZeRO partitions one flat
// buffer per optimizer group in that order, so a checkpoint written in any other order loads shifted values.
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "formats/hf/family_map.h"

namespace ucpkit::formats::hf {

// The permutation of `names` (in-memory Hugging Face names) into `family`'s module_order: out[k] is the
// index into `names` of the k-th parameter. Names outside every layer ({L}) keep the map's place before
// or after the layers. Throws Error naming `where` and the map when the map has no module_order or a
// name matches none of its entries.
std::vector<size_t> engine_order(const Family& family, const std::vector<std::string>& names, const std::string& where);

// A model with tied embeddings: (the output layer's name, the embedding's), from `family`'s two vocabulary rules
// (the optional one is the head, which a tied model does not save). The engine's state_dict holds the head as the
// embedding's tensor. Throws Error naming the map when it has not exactly one of each.
std::pair<std::string, std::string> tied_output(const Family& family);

}  // namespace ucpkit::formats::hf
