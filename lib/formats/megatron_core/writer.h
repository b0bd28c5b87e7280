// Where a Megatron-Core torch_dist save puts each parameter of a Megatron-Core-named universal folder
// (docs/formats-megatron-core.md, "Universal names"): the stored keys as Megatron-Core 0.19 names
// them, their chunks per rank of a target mesh, and the DCP save plan (formats/dcp/save_plan's
// SavePlan, built here because its Targets are torch meshes, not Megatron's). Plain data, no I/O.
//  * keys: `decoder.layers.<param>` with a layer axis (homogeneous stack) or `decoder.layers.{L}.<param>`
//    (non-homogeneous: args.moe_layer_freq a list or an int > 1, ...; transformer/transformer_block.py
//    :730-781); experts `...mlp.experts.experts.<param>` with an expert axis after the layer axis
//    (transformer/moe/experts.py:1386-1403); other keys as named;
//  * the fully_reshardable optimizer state `optimizer.state.{param,exp_avg,exp_avg_sq}.<key>` with
//    the key's shape in fp32 (optimizer/distrib_optimizer.py:1690-1826);
//  * chunks: one per layer (layer axis), per expert (expert axis) and per TP piece along the TP split
//    dimension of the local GPT layer spec (column-parallel rows: linear_qkv, linear_fc1, embedding,
//    output layer; row-parallel columns: linear_proj, linear_fc2; the rest whole); a SwiGLU fc1 as
//    2 * TP row pieces, also at TP 1 and for experts (each TP rank one in the W half, one in the V
//    half: transformer/mlp.py:425-490); experts are not TP-split otherwise (expert tensor parallelism 1);
//  * files: chunk of TP rank t, pipeline stage s, expert-parallel rank r written by rank
//    t + TP * r + TP * DP * s (Megatron's default order tp-cp-ep-dp-pp with CP 1: the first DP replica
//    writes, an expert's chunk the DP rank whose EP rank owns it); bytes items by rank 0.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "formats/dcp/save_plan.h"
#include "io/dtype.h"

namespace ucpkit::formats::megatron_core {

struct WriteMesh {
  int64_t tp = 1, pp = 1, ep = 1, dp = 1;
};

struct WriteLayout {
  WriteMesh mesh;
  int64_t num_layers = 0;
  bool homogeneous = true;  // decoder.layers.<param> stacks with a layer axis
  bool swiglu = false;      // linear_fc1 holds [W_all; V_all]
  DType model_dtype = DType::BFloat16;
  bool optimizer = true;    // write optimizer.state.* (fully_reshardable)
  // An MoE layer's pre-MLP norm stored under both layer specs' keys (whichever the universal names use): the local spec's
  // mlp.linear_fc1.layer_norm_* (its sharded_state_dict_keys_map) and the Transformer Engine spec's
  // pre_mlp_layernorm.* (a TENorm module, no map), gpt_layer_specs.py (core_v0.19.0 / 0.16.1:
  // get_gpt_layer_local_spec's map, get_gpt_layer_with_transformer_engine_spec's MoE layers). For sources
  // no Megatron run chose a spec for (a Hugging Face import, a Megatron-DeepSpeed export: args without
  // transformer_impl), so that Megatron loads the output with its default flags either way
  // (transformer_impl transformer_engine is Megatron's default, local its CPU spec; the key the job's
  // spec does not ask for is an unexpected key, which the default dist_ckpt_strictness accepts).
  bool both_norm_keys = false;
};

// One stored model key and the universal parameters it is made of.
struct StoredKey {
  std::string key;                   // e.g. decoder.layers.mlp.linear_fc1.weight
  std::vector<int64_t> size;         // stored shape (leading layer / expert axes first)
  size_t leading = 0;                // 0, 1 or 2 leading axes
  std::vector<size_t> members;       // universal parameter per leading position, row-major
  int tp_dim = -1;                   // TP split dimension of the parameter (-1: not split)
  bool swiglu = false;               // split in 2 * TP row pieces (also at TP 1: its W and V halves)
  int64_t tp = 1;                    // TP degree of the key (experts: 1, expert tensor parallelism 1)
  // Pieces along tp_dim: TP (2 * TP for SwiGLU), 1 when not split.
  int64_t parts() const { return tp_dim < 0 ? 1 : tp * (swiglu ? 2 : 1); }
  int64_t stage_layer = -1;          // layer of a per-layer key (for its pipeline stage), -1 none
  bool expert = false;
};

// What one planned entry holds.
struct EntrySource {
  enum Kind { Model, State, Bytes } kind = Model;
  size_t key = 0;     // Model / State: index into keys
  std::string state;  // State: param | exp_avg | exp_avg_sq
};

struct TorchDistWritePlan {
  std::vector<StoredKey> keys;
  dcp::SavePlan plan;                // entries, chunks and files
  std::vector<EntrySource> sources;  // [entry]
};

// Whether Megatron-Core stacks the decoder layers (transformer_block.py:730-759) for these args:
// moe_layer_freq an int > 1 or a list, linear_attention_freq likewise, heterogeneous specs.
// `moe_layer_freq_list`, `linear_attention_freq_list`: the arg is a list; the ints otherwise (1 when unset).
bool homogeneous_layers(bool moe_layer_freq_list, int64_t moe_layer_freq, bool linear_attention_freq_list,
                        int64_t linear_attention_freq, bool heterogeneous);

// The plan for the universal parameters `names` / `shapes` and the bytes items `bytes_fqns` (written
// as given, e.g. common_state/shard_0_1). Throws Error naming `file` for a name outside the
// Megatron-Core universal names, a layer or expert missing from a stack, shapes that differ inside a
// stack, or a TP split that does not divide.
TorchDistWritePlan plan_torch_dist_write(const std::vector<std::string>& names,
                                         const std::vector<std::vector<int64_t>>& shapes,
                                         const std::vector<std::string>& bytes_fqns, const WriteLayout& layout,
                                         const std::string& file);

// The chunk's position: the universal parameter it belongs to and its box inside that parameter.
struct ChunkOrigin {
  size_t param = 0;
  dcp::Chunk box;  // offsets / sizes in the parameter (leading axes dropped)
};
ChunkOrigin chunk_origin(const TorchDistWritePlan& p, size_t entry, size_t chunk);

}  // namespace ucpkit::formats::megatron_core
