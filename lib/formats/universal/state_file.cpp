// zero/<param>/<state>.pt: the one writer and reader of its keys.
#include "formats/universal/state_file.h"

#include "core/error.h"
#include "formats/deepspeed/pickled_classes.h"

namespace ucpkit::formats::universal {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;

namespace {

// DeepSpeed's key names (checkpoint/constants.py:30,67,73,81,83,123,124).
constexpr const char* kParam = "param";
constexpr const char* kCatDim = "cat_dim";
constexpr const char* kParamNSubParams = "param_n_sub_params";
constexpr const char* kSubParamShape = "sub_param_shape";
constexpr const char* kVocabTensor = "vocab_tensor";
constexpr const char* kIsExpertParam = "is_expert_param";
constexpr const char* kEpNumExperts = "ep_num_experts";

ValuePtr subparam_shape_value(const patterns::SubParamSpec& s) {
  return formats::deepspeed::subparam_shape(s.patterns, s.shape, s.partition_dim, s.sub_sizes, s.sizes_as_tuple);
}

int64_t int_of(const ValuePtr& v, const std::string& path, const char* key) {
  if (!v || v->kind != Kind::Int) fail(path, std::string("'") + key + "' is not an int");
  return v->i;
}

bool bool_of(const ValuePtr& v, const std::string& path, const char* key) {
  if (!v || v->kind != Kind::Bool) fail(path, std::string("'") + key + "' is not a bool");
  return v->b;
}

// The SubparamShape object back as the spec it was written from (PatternSet::from_json's reading of
// the same fields: the entry at partition_dim is a tuple of sizes or a count of equal sub-params).
patterns::SubParamSpec subparam_spec_of(const ValuePtr& v, const std::string& path) {
  const auto bad = [&](const std::string& why) -> patterns::SubParamSpec {
    fail(path, std::string("'") + kSubParamShape + "' is not a SubparamShape: " + why);
  };
  if (!v || v->kind != Kind::Object || v->class_path() != "deepspeed.checkpoint.universal_checkpoint.SubparamShape")
    return bad(v ? v->repr(1) : "missing");
  const ValuePtr pats = v->attr("patterns"), shape = v->attr("shape"), dim = v->attr("partition_dim");
  if (!pats || pats->kind != Kind::List || !shape || shape->kind != Kind::Tuple || !dim || dim->kind != Kind::Int)
    return bad("needs patterns (list), shape (tuple) and partition_dim (int)");
  patterns::SubParamSpec s;
  s.partition_dim = dim->i;
  if (s.partition_dim < 0 || s.partition_dim >= static_cast<int64_t>(shape->items.size()))
    return bad("partition_dim " + std::to_string(s.partition_dim) + " outside its shape");
  for (const auto& p : pats->items) s.patterns.push_back(p ? p->as_str() : std::string());
  for (size_t d = 0; d < shape->items.size(); ++d) {
    const ValuePtr& e = shape->items[d];
    if (static_cast<int64_t>(d) == s.partition_dim && e && e->kind == Kind::Tuple) {
      int64_t sum = 0;
      for (const auto& x : e->items) sum += s.sub_sizes.emplace_back(int_of(x, path, kSubParamShape));
      s.shape.push_back(sum);
    } else if (static_cast<int64_t>(d) == s.partition_dim) {
      s.sizes_as_tuple = false;
      s.sub_sizes.assign(static_cast<size_t>(int_of(e, path, kSubParamShape)), -1);
      s.shape.push_back(-1);
    } else {
      s.shape.push_back(int_of(e, path, kSubParamShape));
    }
  }
  return s;
}

}  // namespace

ValuePtr to_pickle(const StateFile& f) {
  if (f.bare) return Value::of_tensor(f.param);
  auto d = Value::dict();
  if (f.ep_num_experts) {  // _save_zero3_autoep_universal_tensor's order
    d->set_item(kParam, Value::of_tensor(f.param));
    d->set_item(kCatDim, Value::integer(f.cat_dim.value_or(0)));
    d->set_item(kIsExpertParam, Value::boolean(true));
    d->set_item(kEpNumExperts, Value::integer(*f.ep_num_experts));
    return d;
  }
  // merge_tp_slices's order: the join's keys, then vocab_tensor, then param.
  if (f.cat_dim) d->set_item(kCatDim, Value::integer(*f.cat_dim));
  if (f.param_n_sub_params) d->set_item(kParamNSubParams, Value::integer(*f.param_n_sub_params));
  if (f.sub_param_shape) d->set_item(kSubParamShape, subparam_shape_value(*f.sub_param_shape));
  if (f.vocab_tensor) d->set_item(kVocabTensor, Value::boolean(true));
  d->set_item(kParam, Value::of_tensor(f.param));
  return d;
}

StateFile read_state_file(const ValuePtr& root, const std::string& path) {
  StateFile f;
  if (root && root->kind == Kind::Tensor) {
    f.bare = true;
    f.param = root->as_tensor();
    return f;
  }
  if (!root || root->kind != Kind::Dict) fail(path, "not a universal state file");
  auto param = root->get(kParam);
  if (!param || param->kind != Kind::Tensor) fail(path, "no 'param' tensor");
  f.param = param->as_tensor();
  if (auto v = root->get(kCatDim)) f.cat_dim = int_of(v, path, kCatDim);
  if (auto v = root->get(kParamNSubParams)) f.param_n_sub_params = int_of(v, path, kParamNSubParams);
  if (auto v = root->get(kSubParamShape)) f.sub_param_shape = subparam_spec_of(v, path);
  if (auto v = root->get(kVocabTensor)) f.vocab_tensor = bool_of(v, path, kVocabTensor);
  const auto expert = root->get(kIsExpertParam);
  if (expert && bool_of(expert, path, kIsExpertParam)) {
    auto n = root->get(kEpNumExperts);
    if (!n) fail(path, std::string("an expert parameter without '") + kEpNumExperts + "'");
    f.ep_num_experts = int_of(n, path, kEpNumExperts);
  }
  return f;
}

}  // namespace ucpkit::formats::universal
