// Megatron-DeepSpeed's GPTModelPipe for a Llama-style model (RMSNorm, grouped-query attention with one fused
// query_key_value, SwiGLU, no biases, untied or tied embeddings) as a fresh run saves it, from deepspeedai/
// Megatron-DeepSpeed 4efb479: the PipelineModule's specs (megatron/model/gpt_model.py:341-440: a function, the
// embedding at 1 (LayerSpec untied, TiedLayerSpec 'embed' tied), the blocks from 2, the final RMSNorm, then
// LMHeadPipe or the tied embedding again), its universal_checkpoint_info (gpt_model.py:84-185) and the arguments
// (megatron/arguments.py:619-681, 937-939). Plain data: what a Hugging Face import's Megatron-DeepSpeed template
// is made of (to_universal/hf_megatron_deepspeed.h).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/pipeline.h"
#include "io/dtype.h"
#include "io/pickle/value.h"
#include "patterns/pattern_set.h"

namespace ucpkit::formats::deepspeed {

// --make-vocab-size-divisible-by's default (megatron/arguments.py:644): the vocabulary is padded to it times TP.
inline constexpr int64_t kGptPipeVocabMultiple = 128;

struct GptPipeModel {
  int64_t hidden = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, max_positions = 0;
  int64_t vocab = 0;       // the vocabulary rows (unpadded)
  double norm_eps = 1e-5;  // --layernorm-epsilon
  int64_t rope_theta = 10000;  // --rotary-position-embeddings-theta (an int)
  bool tied = false;
  DType dtype = DType::BFloat16;
};

struct GptPipeLayout {
  // Parameters in the PipelineModule's named_parameters order (tied modules first, then the layers by index),
  // shapes at TP = 1.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  std::map<int, std::vector<std::string>> layer_keys;  // each layer file's keys, in registration order
  PipelineNumbering numbering;
  int64_t padded_vocab = 0;  // the vocabulary padded to kGptPipeVocabMultiple at TP = 1
  patterns::PatternSet checkpoint_patterns;  // universal_checkpoint_info: the TP patterns, the QKV as sub-parameters
};
GptPipeLayout gpt_pipe_layout(const GptPipeModel& m);

// The mp_rank_00_model_states.pt of such a run at TP = PP = DP = 1 before its first step: the engine's keys of
// release `ds_version` (fresh_engine_model_states) with `module` None (the layer files hold it), param_shapes in
// Megatron's two groups (get_param_groups: weight decay for the matrices, none for the norms), iteration 0, no
// scheduler, sampler or RNG state, Megatron's `args` (megatron_core/deepspeed_common_state.h megatron_deepspeed_args)
// and the layout's checkpoint info.
pickle::ValuePtr fresh_gpt_pipe_model_states(const GptPipeModel& m, const GptPipeLayout& layout, const pickle::ValuePtr& args,
                                             const std::string& ds_version);

}  // namespace ucpkit::formats::deepspeed
