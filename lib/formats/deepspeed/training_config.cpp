#include "formats/deepspeed/training_config.h"

#include "formats/deepspeed/model_states.h"

namespace ucpkit::formats::deepspeed {

using pickle::Kind;
using pickle::ValuePtr;

namespace {

ValuePtr args_of(const ValuePtr& root) {
  auto a = root && root->kind == Kind::Dict ? root->get("args") : nullptr;
  return a && a->kind == Kind::Object ? a : nullptr;
}

int64_t arg_int(const ValuePtr& args, const char* field) {
  auto a = args ? args->attr(field) : nullptr;
  return a && a->kind == Kind::Int ? a->i : 0;
}

std::optional<bool> arg_bool(const ValuePtr& args, const char* field) {
  auto a = args ? args->attr(field) : nullptr;
  if (a && a->kind == Kind::Bool) return a->b;
  return std::nullopt;
}

// ds_config's {"<key>": {"enabled": b}} (DeepSpeed's precision sections); false when absent.
bool config_enabled(const ValuePtr& cfg, const char* key) {
  auto section = cfg->get(key);
  if (!section || section->kind != Kind::Dict) return false;
  auto e = section->get("enabled");
  return e && e->kind == Kind::Bool && e->b;
}

}  // namespace

TrainingConfig training_config(const ValuePtr& root) {
  TrainingConfig t;
  if (auto cfg = raw_ds_config(root); cfg && cfg->kind == Kind::Dict) {
    t.dtype = config_enabled(cfg, "fp16")                                          ? DType::Float16
              : config_enabled(cfg, "bf16") || config_enabled(cfg, "bfloat16") ? DType::BFloat16
                                                                                   : DType::Float32;
    t.zero_stage = 0;
    if (auto z = cfg->get("zero_optimization"); z && z->kind == Kind::Dict)
      if (auto st = z->get("stage"); st && st->kind == Kind::Int) t.zero_stage = static_cast<int>(st->i);
    return t;
  }
  const auto args = args_of(root);
  const auto fp16 = arg_bool(args, "fp16"), bf16 = arg_bool(args, "bf16");
  if (fp16 && *fp16) t.dtype = DType::Float16;
  else if (bf16 && *bf16) t.dtype = DType::BFloat16;
  else if (fp16 && bf16) t.dtype = DType::Float32;
  if (args)
    if (auto z = args->attr("zero_stage"); z && z->kind == Kind::Int) t.zero_stage = static_cast<int>(z->i);
  return t;
}

MegatronSizes megatron_sizes(const ValuePtr& root) {
  const auto args = args_of(root);
  MegatronSizes s;
  s.heads = arg_int(args, "num_attention_heads");
  s.kv_heads = arg_int(args, "num_key_value_heads");
  s.hidden = arg_int(args, "hidden_size");
  s.ffn = arg_int(args, "ffn_hidden_size");
  s.vocab_multiple = arg_int(args, "make_vocab_size_divisible_by");
  return s;
}

ValuePtr raw_module(const ValuePtr& root) {
  return root && root->kind == Kind::Dict ? root->get("module") : nullptr;
}

bool is_bf16_optimizer_state(const ValuePtr& optimizer_state) {
  return optimizer_state && optimizer_state->kind == Kind::Dict && !optimizer_state->contains("zero_stage");
}

}  // namespace ucpkit::formats::deepspeed
