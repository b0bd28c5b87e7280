// What a DCP state-dict key is in the state dicts torch's own helpers build: a model tensor, a state of
// one parameter's optimizer state, or a param_groups value (torch 2.6 checkpoint/state_dict.py
// get_state_dict: optimizer state keyed by parameter fqn, :76-78, :780-791; flattened with
// flatten_optimizer_state_dict, :628-686). The key's nested path comes from the planner's flattening map
// (DefaultSavePlanner planner_data, default_planner.py:94, :103), else from the flat key as the usual
// {"model": ..., "optim": ...} wrapper spells it.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "formats/dcp/metadata.h"

namespace ucpkit::formats::dcp {

struct KeyRole {
  enum Kind { Model, OptimizerState, ParamGroup, Other } kind = Other;
  std::string param;  // Model, OptimizerState: the parameter's fqn (a leading "model" component dropped)
  std::string name;   // OptimizerState: the state ("exp_avg", "exp_avg_sq", "step", ...); ParamGroup: the key
  size_t group = 0;   // ParamGroup: index into param_groups
};

// The nested path of flat key `fqn` (planner_data's, else split as described above).
std::vector<std::string> nested_path(const Metadata& md, const std::string& fqn);

// The role of a nested path: under an "optim" / "optimizer" head, "state"/<fqn>/<name> (or one
// flattened "state.<fqn>.<name>" key) is an optimizer state, "param_groups"/<i>/<key> a param_groups
// value, anything else Other; every path without such a head is a model tensor.
KeyRole key_role(const std::vector<std::string>& path);

// What a DCP holds besides its tensors, and under which keys (ucp-info).
struct KeyLayout {
  // "get_state_dict" ({"model": ..., "optim": ...}), "torchtitan" (model keys at the top level, the
  // optimizer under "optimizer"), "model only" (no optimizer), or "other".
  std::string layout;
  bool flattened_optimizer = false;  // flatten_optimizer_state_dict's "state.<fqn>.<name>" keys
  std::map<std::string, size_t> non_tensor_items;  // bytes items by their head ("lr_scheduler", "param_groups", ...)
  // Model tensors without optimizer state beside parameters with it; in a model-only save, those of a
  // dtype no parameter has (int, bool): what ucp-union carries as buffers.
  std::vector<std::string> buffers;
};
KeyLayout key_layout(const Metadata& md);

// The flat keys of `md`'s parameters, what ucp-load's --dtype converts (never buffers or
// counters): the floating-point model tensors that have optimizer state; when `md` holds no optimizer
// state at all (a model-only save), every floating-point model tensor, as nothing tells a parameter
// from a float buffer there (`all_floating` is then set).
std::vector<std::string> parameter_keys(const Metadata& md, bool* all_floating = nullptr);

}  // namespace ucpkit::formats::dcp
