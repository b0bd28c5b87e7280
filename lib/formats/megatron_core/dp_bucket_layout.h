// dp_reshardable buckets unflattened into parameters, for the dense (non-expert) buffer of a GPT
// model with one param dtype and one bucket per dp group: the layout Megatron-Core's
// DistributedOptimizer._compute_per_buffer_param_layout computes (optimizer/distrib_optimizer.py
// :505-585 at core_v0.19.0), recomputed from what the checkpoint holds, because the files do not
// store it (docs/formats-megatron-core.md, "What the dp_reshardable files do not carry"):
//  * the parameters a dp group owns: dp_group_idx is the model-parallel rank, t + TP * p for TP rank
//    t and pipeline stage p (TP fastest); stage p holds layers [p * L/PP, (p+1) * L/PP), stage 0 the
//    embedding, the last stage decoder.final_layernorm and output_layer (untied embeddings only);
//  * their order: GPTModel registration order (embedding, decoder layers in order, each layer's
//    parameters in the order its keys appear in .metadata, the decoder's other parameters,
//    output_layer), reversed (backprop order);
//  * each parameter's TP-local piece from the model tensor's chunks: rank t's chunk along the split
//    dimension (both halves for a SwiGLU fc1: [W_t; V_t]), or the whole tensor when not split;
//  * each start padded to a multiple of 64 elements; the last end must equal the bucket's length
//    (numel_unpadded, the stored global size), which checks the recomputation.
// The expert buffer (chained_1.) likewise: dp group g is the rank in the expert grid's tp-ep-pp group,
// expert TP rank g % ETP, EP rank g / ETP % EP, stage g / (ETP x EP); its local experts
// [EP rank x E/EP, ...) in the experts module's registration order (SequentialMLP: transformer_impl
// local only), each expert parameter's ETP-local piece as a dense parameter's TP piece. Layouts with
// several buckets, param dtypes, virtual or uneven pipeline stages or tied embeddings are refused by name.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/megatron_core/reader.h"

namespace ucpkit::formats::megatron_core {

// One TP-local parameter inside a flat bucket.
struct BucketParam {
  std::string name;                  // ModelParam name (decoder.layers.{L}.<param>)
  int64_t start = 0, end = 0;        // [start, end) in the bucket
  std::vector<int64_t> local_shape;  // the TP-local parameter's shape
  // Where the local piece sits in the global parameter: row ranges along `dim` (two for a SwiGLU
  // fc1, one otherwise) of `size` each; dim -1 when the parameter is not TP-split.
  int dim = -1;
  std::vector<int64_t> offsets;
  int64_t size = 0;
};

struct BucketLayout {
  const Key* bucket = nullptr;  // one of the states' bucket keys (param); the others share the layout
  int64_t tp_rank = 0, pp_stage = 0;
  std::vector<BucketParam> params;  // in bucket order
};

// The layout of every dense dp_reshardable bucket of `ck` (one per dp group). Throws Error naming
// .metadata for what it does not handle or when the recomputed layout does not fill the bucket.
std::vector<BucketLayout> dense_bucket_layouts(const Checkpoint& ck);

// The same for the expert buffer (chained_1.), one layout per expert dp group.
std::vector<BucketLayout> expert_bucket_layouts(const Checkpoint& ck);

// per_bucket_numel or per_bucket_numel_unpadded of one dp group, as saved: per buffer (gbuf_idx), its
// (param dtype, grad dtype) key as the bucket keys write it and the numel of each of its buckets.
struct BufferNumels {
  std::string dtypes;  // "(torch.bfloat16, torch.float32)"
  std::vector<int64_t> numel;
};

// One bucket of a dp group as ucpkit sees it: where its recomputed layout ends, what its flat tensor
// stores (numel_unpadded), and what its end is padded to (lcm(dp, 128), with 2^16 for
// pad_buckets_for_high_nccl_busbw: optimizer/param_layout.py:29-40).
struct BucketNumel {
  int64_t gbuf = 0, bucket = 0;
  std::string dtypes;
  int64_t layout_end = 0, stored = 0, pad_divisor = 128;
};

// The saved value `v` (a list of {(dtype, dtype): [numel, ...]}); nullopt when it has another form.
std::optional<std::vector<BufferNumels>> buffer_numels(const pickle::Value& v);

// Empty when `saved` (per_bucket_numel, or with `unpadded` per_bucket_numel_unpadded) agrees with
// the dp group's `buckets`, else what differs (one line): the padded numel must be the layout's end
// padded, the unpadded the stored length, and each buffer's unpadded sum its layouts' ends.
std::string bucket_numel_mismatch(const std::vector<BufferNumels>& saved, bool unpadded,
                                  const std::vector<BucketNumel>& buckets);

// Reads every dp group's per_bucket_numel and per_bucket_numel_unpadded (chained_{i}. as its
// buckets) and throws Error naming the item's file and key when one disagrees with `layouts`.
void check_per_bucket_numel(const Checkpoint& ck, const std::vector<BucketLayout>& layouts);

// The TP-local value of `p` for optimizer state `state` (param | exp_avg | exp_avg_sq), cut out of
// the bucket read once by the caller (`bucket_state`: Checkpoint::read_bucket of that state's key).
Tensor bucket_param(const Tensor& bucket_state, const BucketParam& p);

// The same piece cut out of a global model-space tensor of the parameter (e.g. the fully_reshardable
// state): what bucket_param must equal.
Tensor tp_local_piece(const Tensor& global_param, const BucketParam& p);

}  // namespace ucpkit::formats::megatron_core
