// DCP state-dict keys and what they hold (state_keys.h).
#include "formats/dcp/state_keys.h"

#include <algorithm>
#include <set>

namespace ucpkit::formats::dcp {

namespace {

std::string join(const std::vector<std::string>& parts, size_t from, size_t to) {
  std::string s;
  for (size_t k = from; k < to; ++k) s += (k > from ? "." : "") + parts[k];
  return s;
}

bool digits(const std::string& s) { return !s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), ::isdigit); }

}  // namespace

// The nested path of a flat key: planner_data's, else the key split as get_state_dict's dicts nest it
// ("optim.state.<fqn>.<name>", "optim.param_groups.<i>.<key>", "model.<fqn>"; torch 1.13's planner
// and non-default planners record none).
std::vector<std::string> nested_path(const Metadata& md, const std::string& fqn) {
  if (md.planner)
    if (std::vector<std::string> p = md.planner->strings(fqn); !p.empty()) return p;
  for (const char* head : {"optim.", "optimizer."}) {
    const std::string h = head;
    if (fqn.rfind(h + "state.", 0) == 0) {
      const std::string rest = fqn.substr(h.size() + 6);
      const size_t dot = rest.rfind('.');
      if (dot != std::string::npos && dot > 0)
        return {h.substr(0, h.size() - 1), "state", rest.substr(0, dot), rest.substr(dot + 1)};
    }
    if (fqn.rfind(h + "param_groups.", 0) == 0) {
      const std::string rest = fqn.substr(h.size() + 13);
      const size_t dot = rest.find('.');
      if (dot != std::string::npos) return {h.substr(0, h.size() - 1), "param_groups", rest.substr(0, dot), rest.substr(dot + 1)};
    }
  }
  if (fqn.rfind("model.", 0) == 0) return {"model", fqn.substr(6)};
  return {fqn};
}

KeyRole key_role(const std::vector<std::string>& p) {
  KeyRole r;
  if (p.size() >= 2 && (p[0] == "optim" || p[0] == "optimizer")) {
    if (p[1] == "state" && p.size() >= 4) {
      r.kind = KeyRole::OptimizerState, r.param = join(p, 2, p.size() - 1), r.name = p.back();
    } else if (p[1] == "param_groups" && p.size() == 4 && digits(p[2])) {
      r.kind = KeyRole::ParamGroup, r.group = std::stoul(p[2]), r.name = p[3];
    } else if (p.size() == 2 && p[1].rfind("state.", 0) == 0 && p[1].rfind('.') > 6) {  // flatten_optimizer_state_dict
      const size_t dot = p[1].rfind('.');
      r.kind = KeyRole::OptimizerState, r.param = p[1].substr(6, dot - 6), r.name = p[1].substr(dot + 1);
    }
    return r;
  }
  r.kind = KeyRole::Model;
  r.param = p.size() >= 2 && p[0] == "model" ? join(p, 1, p.size()) : join(p, 0, p.size());
  return r;
}


std::vector<std::string> parameter_keys(const Metadata& md, bool* all_floating) {
  std::set<std::string> with_state;
  std::vector<std::pair<std::string, std::string>> model;  // (flat key, parameter fqn) of floating model tensors
  for (const Entry& e : md.entries) {
    if (e.is_bytes) continue;
    const KeyRole r = key_role(nested_path(md, e.fqn));
    if (r.kind == KeyRole::OptimizerState) with_state.insert(r.param);
    if (r.kind == KeyRole::Model && dtype_is_floating(e.dtype)) model.emplace_back(e.fqn, r.param);
  }
  if (all_floating) *all_floating = with_state.empty();
  std::vector<std::string> out;
  for (const auto& [key, param] : model)
    if (with_state.empty() || with_state.count(param)) out.push_back(key);
  return out;
}

KeyLayout key_layout(const Metadata& md) {
  KeyLayout k;
  bool nested_model = false, top_model = false, optim = false, optimizer = false;
  std::set<std::string> with_state;
  std::vector<std::pair<std::string, DType>> model;
  for (const Entry& e : md.entries) {
    const std::vector<std::string> path = nested_path(md, e.fqn);
    const KeyRole r = key_role(path);
    if (e.is_bytes) {
      const bool group = r.kind == KeyRole::ParamGroup ||
                         (path.size() >= 2 && (path[0] == "optim" || path[0] == "optimizer") &&
                          (path[1] == "param_groups" || path[1].rfind("param_groups.", 0) == 0));
      ++k.non_tensor_items[group ? "param_groups" : r.kind == KeyRole::OptimizerState ? "optimizer state" : path[0]];
      continue;
    }
    if (r.kind == KeyRole::OptimizerState) {
      with_state.insert(r.param);
      (path[0] == "optim" ? optim : optimizer) = true;
      k.flattened_optimizer |= path.size() == 2;
    } else if (r.kind == KeyRole::Model) {
      (path.size() >= 2 && path[0] == "model" ? nested_model : top_model) = true;
      model.push_back({r.param, e.dtype});
    }
  }
  k.layout = with_state.empty() ? "model only"
             : nested_model && optim ? "get_state_dict"
             : optimizer && top_model && !nested_model ? "torchtitan"
                                      : "other";
  // As ucp-union tells them (to_universal/from_dcp plan_dcp): without optimizer state beside parameters
  // with it, or in a model-only save of a dtype no parameter has.
  for (const auto& [m, dtype] : model)
    if (with_state.empty() ? !dtype_is_floating(dtype) : !with_state.count(m)) k.buffers.push_back(m);
  return k;
}

}  // namespace ucpkit::formats::dcp
