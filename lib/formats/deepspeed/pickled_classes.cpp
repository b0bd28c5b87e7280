// DeepSpeed's pickled classes.
#include "formats/deepspeed/pickled_classes.h"

namespace ucpkit::formats::deepspeed {

using pickle::Object;
using pickle::Value;
using pickle::ValuePtr;

ValuePtr fragment_address(int64_t numel, int64_t start) {
  auto st = Value::dict();
  st->set_item("numel", Value::integer(numel));
  st->set_item("start", Value::integer(start));
  // A dataclass pickles as NEWOBJ on the class, then BUILD with its __dict__.
  return Value::make_object("deepspeed.utils.tensor_fragment", "fragment_address", Value::tuple(), st,
                            Object::Build::NewObj);
}

ValuePtr zero_stage_enum(int stage) {
  // An int Enum pickles as REDUCE: ZeroStageEnum(value).
  return Value::make_object("deepspeed.runtime.zero.config", "ZeroStageEnum", Value::tuple({Value::integer(stage)}),
                            nullptr, Object::Build::Reduce);
}

ValuePtr loss_scaler(DType dtype) {
  auto st = Value::dict();
  if (dtype == DType::Float16) {
    st->set_item("cur_scale", Value::real(65536.0));
    st->set_item("dynamic", Value::boolean(true));
    st->set_item("cur_iter", Value::integer(0));
    st->set_item("last_overflow_iter", Value::integer(-1));
    st->set_item("scale_factor", Value::real(2.0));
    st->set_item("scale_window", Value::integer(1000));
    st->set_item("min_scale", Value::integer(1));
    st->set_item("delayed_shift", Value::integer(1));
    st->set_item("cur_hysteresis", Value::integer(1));
    st->set_item("consecutive_hysteresis", Value::boolean(false));
    st->set_item("raise_error_at_min_scale", Value::boolean(true));
    st->set_item("dtype", Value::torch_dtype(DType::Float16));
    return Value::make_object("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", Value::tuple(), st,
                              Object::Build::NewObj);
  }
  st->set_item("cur_scale", Value::integer(1));
  st->set_item("dynamic", Value::boolean(false));
  return Value::make_object("deepspeed.runtime.fp16.loss_scaler", "LossScaler", Value::tuple(), st,
                            Object::Build::NewObj);
}

ValuePtr subparam_shape(const std::vector<std::string>& patterns, const std::vector<int64_t>& shape,
                        int64_t partition_dim, const std::vector<int64_t>& sub_sizes, bool sizes_as_tuple) {
  auto pats = Value::list();
  for (const auto& p : patterns) pats->items.push_back(Value::str(p));
  auto dims = Value::tuple();
  for (size_t d = 0; d < shape.size(); ++d) {
    if (static_cast<int64_t>(d) != partition_dim) {
      dims->items.push_back(Value::integer(shape[d]));
    } else if (sizes_as_tuple) {
      auto sizes = Value::tuple();
      for (auto s : sub_sizes) sizes->items.push_back(Value::integer(s));
      dims->items.push_back(sizes);
    } else {
      dims->items.push_back(Value::integer(static_cast<int64_t>(sub_sizes.size())));
    }
  }
  auto state = Value::dict();
  state->set_item("patterns", pats);
  state->set_item("shape", dims);
  state->set_item("partition_dim", Value::integer(partition_dim));
  // A dataclass pickles as copyreg.__newobj__: NEWOBJ on the class, then BUILD with __dict__.
  return Value::make_object("deepspeed.checkpoint.universal_checkpoint", "SubparamShape", Value::tuple(), state,
                            Object::Build::NewObj);
}

}  // namespace ucpkit::formats::deepspeed
