// UcpInfo (the paper's planning step, formats.md section 4 reversed): for a target layout, which
// slice of which atomic tensor every target rank owns, where it sits in the ZeRO flat buffers and
// which fragment of those buffers each DP rank keeps. Pure data: computed without I/O, printable as
// JSON (`ucp-load --plan`).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/deepspeed/file_names.h"
#include "io/dtype.h"
#include "reshard/model_info.h"

namespace ucpkit::reshard {

// The largest target world size (tp * pp * dp) ucp-load plans for: 2^18 = 262,144 ranks, more than
// any machine has; beyond it the plan alone would take gigabytes (docs/reliability.md).
constexpr int64_t kMaxTargetWorldSize = int64_t{1} << 18;

struct TargetLayout {
  int tp = 1, pp = 1, dp = 1, zero_stage = 1, ep = 1;
  int etp = 0;  // --etp: expert tensor-parallel degree (torch_dist output; 0: as the source, see target_expert_tp)
  DType dtype = DType::BFloat16;  // low-precision module weights
  bool bf16_optimizer = false;    // BF16_Optimizer shards (bf16, ZeRO 0/1): padding kept, no zero_stage
  int64_t sub_group_size = 1000000000;  // ZeRO-3: zero_optimization.sub_group_size (DeepSpeed's default 1e9)
  std::string ds_line;            // native MoE: DeepSpeed version line to write ("" = the source's)
  // PipelineModule sources: --partition-method (parameters, uniform, type:<regex>; DeepSpeed's
  // PipelineModule(partition_method=...)). "": Megatron's rule (stage_of_blocks) for a Megatron model,
  // DeepSpeed's default 'parameters' for any other PipelineModule (megatron_blocks).
  std::string partition_method;
  // --layer-types FILE (formats/deepspeed/partition.h read_layer_types): the PipelineModule's layer class
  // names in order; type:<regex> matches them, and their count is the layer list's length (a trailing
  // function layer has no file). Empty: not given.
  std::string layer_types_file;
  std::vector<std::string> layer_types;
  nlohmann::json to_json() const;
};

// A TP slice of a universal tensor: along `dim`, the concatenation of `pieces` (start, length) of
// the tensor whose dim-0 is padded with zero rows up to `padded_rows` (vocabulary parameters).
struct TpSlice {
  int dim = 0;
  std::vector<std::pair<int64_t, int64_t>> pieces;
  std::vector<int64_t> shape;  // the slice's shape
  int64_t padded_rows = -1;    // -1: no vocabulary padding
  int64_t numel() const;
};

// Rank `t` of `tp` of a parameter of universal shape `shape` under `rule`; `padded_rows` >= 0 pads
// vocabulary rows first. Throws Error when TP does not divide the split dimension.
TpSlice tp_slice(const std::string& name, const std::vector<int64_t>& shape, const patterns::ParamRule& rule,
                 const patterns::PatternSet& set, int tp, int t, int64_t padded_rows);

// One parameter in a flat group buffer of one model-parallel rank.
struct Slot {
  int param = -1;               // index into ModelInfo::params
  std::string name;             // name in param_shapes / param_slice_mappings (local expert index for experts)
  TpSlice slice;
  int64_t offset = 0;           // element offset in the group's flat buffer
  int64_t numel() const { return slice.numel(); }
};

// One optimizer param group of one model-parallel rank, flattened and padded as DeepSpeed does.
// ZeRO-1/2: the buffer is padded to a multiple of 2 * partition_count, then split equally.
// ZeRO-3 (`per_param`): one sub-group; every parameter is split on its own into partition_count
// slices of ceil(numel / partition_count), and a partition is its slices back to back.
struct GroupPlan {
  int group = 0;                // index in the universal optimizer_state param_groups
  std::vector<Slot> slots;      // flat-buffer order
  int64_t numel = 0, padded = 0, partition = 0;
  int partition_count = 1;
  bool per_param = false;
};

// A run of one parameter inside one DP rank's partition: param_slice_mappings' fragment_address.
struct TargetFragment {
  int slot = -1;                // index into GroupPlan::slots
  int64_t start = 0;            // offset in the partition
  int64_t numel = 0;
  int64_t param_offset = 0;     // offset in the flattened TP slice
};

struct PartitionPlan {
  int part = 0;                 // partition index (DP rank)
  int64_t padding = 0;          // padding elements inside this partition
  std::vector<TargetFragment> fragments;
};

// Fragments of partition `part` of `g`.
PartitionPlan partition_of(const GroupPlan& g, int part);

// A pipeline layer file: layer-local names -> slots of this model-parallel rank.
struct LayerFilePlan {
  int layer = 0;
  std::vector<std::pair<std::string, std::pair<int, int>>> entries;  // local name -> (group, slot)
};

// layer_<moe_id>_expert_<expert>_mp_rank_XX_model_states.pt: global names -> (ep_rank, group, slot).
// (ep_rank, group, slot, row): row >= 0 is an index into `rows`, one expert (a dim-0 row of shape
// [1, ...], written without the leading 1) of an AutoEP fused weight; -1: the whole slot (native MoE).
struct ExpertFilePlan {
  int moe_id = 0, expert = 0;
  std::vector<std::pair<std::string, std::array<int, 4>>> entries;
  std::vector<Slot> rows;
};

struct MpRankPlan {
  int mp = 0, pp_rank = 0, tp_rank = 0;
  int template_file = 0;                       // source model file the carried-over state comes from
  std::vector<GroupPlan> groups;
  std::vector<std::pair<int, int>> module;     // (group, slot) in module state_dict order (non-pipeline)
  std::vector<LayerFilePlan> layers;           // pipeline models
  std::vector<std::vector<GroupPlan>> expert_groups;  // native MoE: [ep_rank], partitioned over expert-DP
  std::vector<ExpertFilePlan> expert_files;
  std::string model_file() const;              // mp_rank_XX_model_states.pt
};

struct UcpInfo {
  TargetLayout target;
  int64_t padded_vocab = 0;
  std::vector<MpRankPlan> mp_ranks;            // [pp_rank * tp + tp_rank]
  std::vector<std::vector<int>> stage_layers;  // pipeline layers per stage

  std::string optim_file(int dp_rank, int mp) const;  // [bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt
  // ZeRO-3: zero_pp_rank_D_mp_rank_XX_model_states.pt (one per DP rank, replaces mp_rank_XX_...).
  std::string zero3_model_file(int dp_rank, int mp) const;
  // The facts that decide which files this target writes (file_names.h expected_files); `native_moe`:
  // the expert optimizer files of the version line written.
  formats::deepspeed::TargetFiles files(bool native_moe) const;
  // Native MoE: (ep_rank, expert-DP rank) of DP rank d.
  std::pair<int, int> ep_coords(int dp_rank) const;
  bool data_before_expert = false;
  // Layer files named -model_TT-: always with TP > 1, else as the source named them (a PipelineModule
  // on DeepSpeed's default PipeDataParallelTopology writes layer_LL-model_states.pt).
  bool layer_model_axis = true;
  // Megatron's rank order: tp fastest, then dp, then pp.
  int global_rank(int pp_rank, int dp_rank, int tp_rank) const;
  nlohmann::json to_json(const ModelInfo& model) const;
};

// Checks the target against the model and computes the plan. Throws UsageError for option
// combinations that cannot exist (PP > 1 with ZeRO-2/3, ...) and Error for layouts the model does
// not allow (TP not dividing heads or a split dimension, more stages than layers, ...).
// ZeRO-3 groups are cut into sub-groups as DeepSpeed's _create_fp16_sub_groups does: parameters are
// appended in group order until their per-rank slice sizes reach sub_group_size.
UcpInfo ucp_info(const ModelInfo& model, const TargetLayout& target);

// DeepSpeed's PipelineModule default partition method (pipe/module.py v0.14.5 :130
// `partition_method='parameters'`).
inline constexpr const char* kDefaultPartitionMethod = "parameters";

// Whether a pipeline model's blocks are Megatron's (a layer with attention parameters,
// formats/deepspeed/pipeline.h is_block_local): without --partition-method its stages follow
// stage_of_blocks; any other PipelineModule is partitioned by TargetLayout::partition_method.
bool megatron_blocks(const ModelInfo& model);

// The stage of every pipeline layer holding parameters, partitioned by `method` as DeepSpeed's
// _partition_layers does (formats/deepspeed/partition.h partition_layers): the layer list is layer 0
// up to the largest layer index (a trailing function layer has no file and is not counted), each
// layer weighted by the elements of its parameters' TP-rank-0 slices under `target` (a tied
// parameter counted on its embedding layer and on the tied head's). Throws Error when a stage would
// build no layer with parameters, or (type:<regex>) because the files hold no class names.
std::map<int, int> partitioned_layer_stages(const ModelInfo& model, const TargetLayout& target,
                                            const std::string& method, int64_t padded_vocab);

// The transformer layers of `n` blocks over `pp` stages: contiguous, the first stages get one more
// when `n` is not a multiple of `pp`.
std::vector<int> stage_of_blocks(int n, int pp);

}  // namespace ucpkit::reshard
