// What a Megatron-DeepSpeed model-states file says about how its source trained: the precision and
// ZeRO stage (the saved ds_config, else Megatron's args) and Megatron's model sizes (args). The key
// names stay here; ucp-load's model_info and ucp-info read through these.
#pragma once
#include <cstdint>
#include <optional>

#include "io/dtype.h"
#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

struct TrainingConfig {
  std::optional<DType> dtype;     // fp16 / bf16 / fp32 (nullopt: the file does not say)
  std::optional<int> zero_stage;  // nullopt: the file does not say
};

// From a model-states root. A saved ds_config (a dict) decides both: its "fp16" / "bf16" (or
// "bfloat16") sections' "enabled", else fp32; zero_optimization.stage, else DeepSpeed's default 0.
// Without one, Megatron's args: fp16 / bf16 flags (fp32 when both are present and false) and
// zero_stage, each where args holds it.
TrainingConfig training_config(const pickle::ValuePtr& root);

// Megatron's args sizes (0 where args lacks the field or is not Megatron's Namespace).
struct MegatronSizes {
  int64_t heads = 0, kv_heads = 0, hidden = 0, ffn = 0;
  int64_t vocab_multiple = 0;  // make_vocab_size_divisible_by
};
MegatronSizes megatron_sizes(const pickle::ValuePtr& root);

// The module state dict of a model-states root (null when absent).
pickle::ValuePtr raw_module(const pickle::ValuePtr& root);

// A universal or native optimizer state written by DeepSpeed's BF16_Optimizer: it has no
// "zero_stage" entry (ZeRO-1/2/3 optimizers write one).
bool is_bf16_optimizer_state(const pickle::ValuePtr& optimizer_state);

}  // namespace ucpkit::formats::deepspeed
