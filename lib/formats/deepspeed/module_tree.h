// The `module` entry of an mp_rank_XX_model_states.pt: either a flat state_dict or Megatron's
// nested dict (state_dict_for_save_checkpoint, deepspeed-moe-format.md section 3.1):
//   {'language_model': {'embedding': {'word_embeddings': OD{'weight'}, ...}, 'encoder': OD{'layers.0...'}}}
// Parameter names are the nesting keys joined by '.', as the engine's named_parameters() names them
// (language_model.embedding.word_embeddings.weight, language_model.encoder.layers.0....).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// (flat name, tensor value) of every tensor in the module, in file order.
std::vector<std::pair<std::string, pickle::ValuePtr>> module_tensors(const pickle::ValuePtr& module);
// Whether any dict of the module nests another dict (Megatron's form).
bool module_is_nested(const pickle::ValuePtr& module);
// Whether any dict of the module carries torch's _metadata attribute.
bool module_has_metadata(const pickle::ValuePtr& module);
// Replaces every tensor by replace(flat name, old value); nullptr keeps the old value.
void replace_module_tensors(const pickle::ValuePtr& module,
                            const std::function<pickle::ValuePtr(const std::string&, const pickle::ValuePtr&)>& replace);
// A copy of the module's dicts with every tensor leaf named in `fresh` replaced (taken out of
// `fresh`); other leaves (buffers) travel as they are. Megatron loads the nested module by the same
// key paths it saves, so a leaf's dotted path is the parameter's name.
pickle::ValuePtr with_module_leaves(const pickle::ValuePtr& module, std::map<std::string, pickle::ValuePtr>& fresh);
// Puts `value` under parameter `name` at its place in the tree: in the deepest dict whose path
// prefixes the name (a parameter the template has no entry for).
void insert_module_leaf(const pickle::ValuePtr& module, const std::string& name, pickle::ValuePtr value);
// Removes _metadata from every dict of the module (clone_tensors_for_torch_save's type(d)({...})).
void drop_module_metadata(const pickle::ValuePtr& module);
// Gives every OrderedDict that holds tensors a torch state_dict `_metadata` ({'': {'version': 1},
// 'layers': ..., one entry per module prefix of its keys in pre-order}) when it has none;
// `extra_keys[dict path]` adds keys removed after state_dict() ran (Megatron pops the expert keys
// from 'language_model.encoder', language_model.py:628-631, so its _metadata still lists them), each
// put back after the key sharing most of its module path (torch's module pre-order).
void add_module_metadata(const pickle::ValuePtr& module,
                         const std::vector<std::pair<std::string, std::vector<std::string>>>& extra_keys = {});

}  // namespace ucpkit::formats::deepspeed
