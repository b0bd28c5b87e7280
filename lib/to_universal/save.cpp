// Universal layout files.
#include "to_universal/save.h"


#include <algorithm>
#include <vector>

#include "core/crc32.h"
#include "core/error.h"
#include "formats/deepspeed/pickled_classes.h"
#include "formats/deepspeed/storage_tags.h"

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::Value;
using pickle::ValuePtr;
using patterns::JoinKind;

namespace {
ValuePtr subparam_shape_object(const patterns::SubParamSpec& spec) {
  return formats::deepspeed::subparam_shape(spec.patterns, spec.shape, spec.partition_dim, spec.sub_sizes,
                                            spec.sizes_as_tuple);
}
}  // namespace

ValuePtr state_file_value(const Tensor& param, const patterns::ParamRule& rule, const patterns::PatternSet& set) {
  auto d = Value::dict();
  switch (rule.kind) {
    case JoinKind::Replicate:
    case JoinKind::Average: break;
    case JoinKind::TwoSubParams:
      d->set_item("cat_dim", Value::integer(0));
      d->set_item("param_n_sub_params", Value::integer(2));
      break;
    case JoinKind::SubParams:
      d->set_item("sub_param_shape", subparam_shape_object(set.sub_params.at(rule.sub_param_index)));
      break;
    case JoinKind::Cat: d->set_item("cat_dim", Value::integer(rule.cat_dim)); break;
  }
  if (rule.vocab) d->set_item("vocab_tensor", Value::boolean(true));
  d->set_item("param", Value::of_tensor(param));
  return d;
}

ValuePtr common_optimizer_state(const ValuePtr& root, const std::string& path) {
  if (!root || root->kind != Kind::Dict) fail(path, "not an optimizer-states dict");
  auto osd = root->get("optimizer_state_dict");
  if (!osd || osd->kind != Kind::Dict) fail(path, "no optimizer_state_dict");
  auto out = Value::dict(osd->ordered);
  for (const auto& [k, v] : osd->entries) {
    if (k->kind == Kind::Str && (k->s == "base_optimizer_state" || k->s == "param_slice_mappings" ||
                                 k->s == "single_partition_of_fp32_groups"))
      continue;
    out->entries.emplace_back(k, v);
  }
  auto base = osd->get("base_optimizer_state");
  if (!base) base = osd->get("optimizer_state_dict");  // ZeRO-3
  ValuePtr groups = base && base->kind == Kind::Dict ? base->get("param_groups") : nullptr;
  out->set_item("param_groups", groups ? groups : Value::list());
  formats::deepspeed::tag_storages_cpu(out);  // ds_to_universal writes it from map_location='cpu' loads
  return out;
}

uint32_t tensor_crc32(const Tensor& t) {
  auto c = t.contiguous();
  return crc32_parallel(c.contiguous_bytes());
}

}  // namespace ucpkit::to_universal
