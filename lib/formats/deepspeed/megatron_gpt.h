// Megatron-DeepSpeed's GPT for a Llama-style model (RMSNorm, grouped-query attention with one fused
// query_key_value, SwiGLU, no biases, untied or tied embeddings) as a fresh run saves it, from deepspeedai/
// Megatron-DeepSpeed 4efb479: dense, GPTModelPipe (megatron/model/gpt_model.py:341-440: a function, the embedding
// at 1 (LayerSpec untied, TiedLayerSpec 'embed' tied), the blocks from 2, the final RMSNorm, then LMHeadPipe or the
// tied embedding again); with experts, GPTModel with native DeepSpeed MoE in every layer (its names under
// language_model., the experts under mlp.deepspeed_moe, megatron/model/transformer.py), which DeepSpeed's MoE
// checkpoints hold at TP = PP = 1. The universal_checkpoint_info follows gpt_model.py:84-185, the arguments
// megatron/arguments.py:619-681 and 937-939. Plain data: what a Hugging Face import's Megatron-DeepSpeed template is
// made of (to_universal/hf_megatron_deepspeed.h).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "formats/deepspeed/pipeline.h"
#include "io/dtype.h"
#include "io/pickle/value.h"
#include "patterns/pattern_set.h"

namespace ucpkit::formats::deepspeed {

// --make-vocab-size-divisible-by's default (megatron/arguments.py:644): the vocabulary is padded to it times TP.
inline constexpr int64_t kGptVocabMultiple = 128;

struct MegatronGpt {
  int64_t hidden = 0, ffn = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, max_positions = 0;
  int64_t vocab = 0;           // the vocabulary rows (unpadded)
  double norm_eps = 1e-5;      // --layernorm-epsilon
  int64_t rope_theta = 10000;  // --rotary-position-embeddings-theta (an int)
  bool tied = false;
  int64_t experts = 0;         // > 0: native MoE in every layer, each expert an MLP of `ffn`
  int64_t topk = 1;            // --topk
  double aux_loss = 0.1;       // --moe-loss-coeff (the router's load-balancing loss)
  DType dtype = DType::BFloat16;
};

struct MegatronGptParam {
  std::string name;
  std::vector<int64_t> shape;  // at TP = 1
  int layer = -1, expert = -1;  // an expert: its decoder layer and global id
};

struct MegatronGptLayout {
  bool pipeline = true;  // GPTModelPipe (dense); GPTModel with native MoE otherwise
  // Parameters in named_parameters order (GPTModelPipe: tied modules first, then the layers by index).
  std::vector<MegatronGptParam> params;
  std::map<int, std::vector<std::string>> layer_keys;  // GPTModelPipe: each layer file's keys, in registration order
  PipelineNumbering numbering;                         // GPTModelPipe
  std::vector<int> num_experts;                        // native MoE: experts per MoE layer
  int64_t padded_vocab = 0;                            // the vocabulary padded to kGptVocabMultiple at TP = 1
  patterns::PatternSet checkpoint_patterns;  // universal_checkpoint_info: the TP patterns, the QKV as sub-parameters
};
MegatronGptLayout megatron_gpt_layout(const MegatronGpt& m);

// The mp_rank_00_model_states.pt of such a run at TP = PP = DP = EP = 1 before its first step: the engine's keys of
// release `ds_version` (fresh_engine_model_states); `module` None for GPTModelPipe (the layer files hold it), else
// Megatron's nested module of the dense parameters (0-element placeholders; the experts have files of their own);
// param_shapes in Megatron's groups (get_param_groups: weight decay for the matrices, none for the norms; the experts
// in a third, DeepSpeed's MoE group); num_experts; iteration 0, no scheduler, sampler or RNG state; Megatron's `args`
// (megatron_core/deepspeed_common_state.h megatron_deepspeed_args) and the layout's checkpoint info.
pickle::ValuePtr fresh_megatron_gpt_model_states(const MegatronGpt& m, const MegatronGptLayout& layout,
                                                 const pickle::ValuePtr& args, const std::string& ds_version);

}  // namespace ucpkit::formats::deepspeed
