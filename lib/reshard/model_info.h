// What ucp-load knows about the model in a universal checkpoint: every atomic parameter with its
// universal shape, join rule, optimizer group and pipeline position, plus the vocabulary and
// source-layout facts the target layout is computed from. Read from manifest.json and the copied
// mp_rank model files; plain data once read.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/dtype.h"
#include "io/pickle/value.h"
#include "io/torch/torch_file.h"
#include "formats/deepspeed/pipeline.h"
#include "formats/universal/manifest.h"
#include "patterns/pattern_set.h"

namespace ucpkit::reshard {

struct ParamInfo {
  std::string name;             // universal (atomic) name
  std::vector<int64_t> shape;   // universal shape: vocabulary rows unpadded
  int64_t stored_numel = 0;     // fp32 elements in each state file: prod(shape), except DeepSpeed's ZeRO-3
                                // TP = 1 flat form of a vocabulary tensor, which keeps the padding rows
                                // after the `shape` rows (they are dropped: re-padded with zeros)
  patterns::ParamRule rule;     // how TP splits it (the union rule, reversed)
  int group = 0;                // optimizer param group
  // Pipeline models (names "<layer>.<local>" and "tied_modules.<module>.<local>"):
  int layer = -1;               // pipeline layer index; -1: tied module or non-pipeline name
  std::string local;            // name inside the layer file
  bool transformer = false;     // part of a transformer block (balanced over stages)
  bool tied = false;            // tied_modules.*: first stage; last stage too when pipeline-replicated
  bool step = false;            // zero/<name>/step.pt exists
  bool flat = false;            // the state files hold 1-D tensors of stored_numel (ZeRO-3, TP = 1 form)
  // Native DeepSpeed MoE experts (the universal name carries the global expert id):
  int expert = -1;              // global expert id
  int moe_layer = -1;           // transformer layer index of its MoE layer
  int moe_id = -1;              // MoE layer counter (layer_<moe_id>_expert_<id> files)
  // DeepSpeed AutoEP fused expert weight [E, ...] (docs/formats.md "AutoEP"): E, 0 otherwise; moe_id is
  // its layer's moe_layer_id.
  int autoep_experts = 0;
  int manifest_index = -1;      // position in manifest.json
  std::map<std::string, std::string> state_files;  // state -> relative path in the universal folder
  std::map<std::string, uint32_t> crc32;           // state -> checksum of the tensor elements
  // state -> the 16-bit float dtype the source stored it in (the state file holds it widened to fp32;
  // manifest states' source_dtype): the DCP writer writes that state back in it.
  std::map<std::string, DType> source_dtypes;
};

struct ModelInfo {
  std::vector<ParamInfo> params;        // global flat-buffer order (stages in order, groups interleaved)
  int groups = 0;                       // dense optimizer param groups
  std::vector<std::string> states;      // "fp32", then optimizer states (exp_avg, exp_avg_sq)
  patterns::PatternSet patterns;
  nlohmann::json patterns_json;
  int64_t original_vocab = 0;           // 0: no vocabulary parameter
  int64_t vocab_multiple = 1;           // padded vocab = multiple of vocab_multiple * tp
  bool vocab_multiple_ambiguous = false;  // inferred, and a smaller multiple fits the source as well
  bool pipeline = false;                // names of a PipelineModule (layer files, module = None)
  bool layer_model_axis = true;         // the source's layer files named -model_TT- (source.layer_model_axis)
  bool tied_copy_first = formats::deepspeed::kTiedModulesFirst;  // last stage lists the tied copies before its own params
  int tied_head_layer = -1;             // layer index of the last stage's tied copy
  formats::deepspeed::PipelineNumbering numbering;  // pipeline sources: which layer_NN holds what
  std::map<int, std::vector<std::string>> layer_keys;  // key order of the source's layer files (module order)
  int source_tp = 1, source_pp = 1, source_dp = 1, source_ep = 1;
  bool source_bf16_optimizer = false;   // BF16_Optimizer shards (no zero_stage)
  bool native_moe = false;
  bool autoep = false;                  // DeepSpeed AutoEP source (manifest source.autoep)
  nlohmann::json autoep_layers;         // manifest source.autoep: one entry per AutoEP layer
  std::string ds_line;                  // native MoE: DeepSpeed version line of the source (manifest), "" if not recorded
  std::vector<int> num_experts;         // native MoE: experts per MoE layer
  bool data_before_expert = false;      // use_data_before_expert_parallel_ rank order
  std::vector<int> expert_group_of;     // native MoE: common param_groups index per expert group (decay, no decay)
  // Model sizes from Megatron args, 0 when unknown (for layout validation).
  int64_t heads = 0, kv_heads = 0, hidden = 0, ffn = 0;
  // A universal folder made from a Hugging Face folder for the DeepSpeed engine (to_universal from_hf_engine.cpp):
  // the model's config.json (and generation_config.json) in it, copied beside the written checkpoint as the HF
  // Trainer keeps them; empty otherwise.
  std::vector<std::string> hf_files;
  std::string tag = "global_step0";      // the source checkpoint's tag (global_stepN)
  std::vector<std::string> model_files;  // copied source mp_rank files, [pp_rank * tp + tp_rank]; ZeRO-3
                                         // sources: zero_pp_rank_0_mp_rank_<tp_rank> (weights-free templates)
  int source_zero_stage = 0;             // 0 when not recorded (BF16_Optimizer, native MoE)
  // What the source trained with, from its first model file (DeepSpeed's ds_config, else Megatron's
  // args); unset when neither records it. ucp-load's defaults for --dtype and --zero-stage.
  std::optional<DType> source_dtype;
  std::optional<int> source_config_zero_stage;
  // No DeepSpeed model files (a universal folder made from a DCP or torch_dist checkpoint, or by
  // --to-names megatron-core): the parameters come from manifest.json alone, in its order, and only the
  // layout-free outputs (dcp, safetensors) can be written from it.
  bool manifest_only = false;
  // Model tensors without optimizer state (manifest "buffers": a DCP's buffers and counters), each
  // written in its own dtype whatever --dtype says; not in `params`.
  std::vector<formats::universal::UniversalBuffer> buffers;
  // A DCP source's other entries, verbatim (manifest "items"), and the keys it saved under where they are
  // not what ucp-load --format dcp writes by default (formats/dcp/key_record.h).
  std::vector<formats::universal::UniversalItem> items;
  nlohmann::json dcp_keys = nlohmann::json::object();
  pickle::ValuePtr optimizer_state;      // the common optimizer state: the manifest's optimizer_state file
                                         // (read once here) or, in direct mode, the one built from the source

  int param_index(const std::string& name) const;
};

// Reads `universal_dir`: manifest.json, the copied model files (param_shapes give group membership
// and flat-buffer order) and zero/optimizer_state.pt. Throws Error when the folder is incomplete or
// disagrees with its manifest.
ModelInfo read_model_info(const std::string& universal_dir);

// What read_model_info reads, already at hand: a universal folder's, or (ucp-load's direct mode) one
// made in memory from a native checkpoint's extract plan (`dir` empty: no state files on disk, no
// checksums in the manifest).
struct UniversalMeta {
  formats::universal::UniversalManifest manifest;       // manifest.json's content
  std::string manifest_path;                // names it in messages
  std::string dir;                          // the universal folder; "" for an in-memory manifest
  std::vector<std::string> model_files;     // resolved paths, in manifest order
  pickle::ValuePtr optimizer_state;         // zero/optimizer_state.pt's root (nullptr: read optimizer_state_path)
  std::string optimizer_state_path;
  TorchLoadOptions open;                    // how its files are opened (a direct source's: DirectInput::open)
};
// The ModelInfo of `meta`: the steps below, plus reading the model files and the optimizer state.
ModelInfo model_info_from(const UniversalMeta& meta);
// The UniversalMeta of universal folder `universal_dir` (manifest.json read, model and optimizer state
// files resolved inside the folder), and read_model_info of it; a malformed manifest is an Error naming it.
UniversalMeta read_universal_meta(const std::string& universal_dir);
ModelInfo read_model_info(const UniversalMeta& meta);

// Steps of model_info_from that read no file (tests/reshard/model_info_test.cpp).
// The source-layout fields, the pattern set and the model files (their count checked against the
// source layout).
ModelInfo source_model_info(const UniversalMeta& meta, const formats::universal::UniversalSource& src);
// Every parameter of the manifest by name (group, order and pipeline position not yet known); sets
// m.states ("fp32" first) and m.native_moe. On disk (meta.dir set) the state files must stay inside
// the folder and carry a checksum.
std::map<std::string, ParamInfo> params_from_manifest(ModelInfo& m, const UniversalMeta& meta);
// Model sizes and the vocabulary padding multiple from the first model file's Megatron args, the
// training precision and ZeRO stage (source_dtype, source_config_zero_stage) from its ds_config or
// args, and an AutoEP source's rank order from its ds_config when the manifest does not record it.
void read_model_file_facts(ModelInfo& m, const pickle::ValuePtr& first, bool data_before_expert_recorded);
// m.params in global flat-buffer order with their optimizer groups, from each pipeline stage's
// param_shapes (`stage_root(s)`: stage s's TP-rank-0 model file); ZeRO-3 sources map sub-groups to
// groups through the optimizer state's param_groups (`osd`, read from `opt_path`).
using StageRoot = std::function<pickle::ValuePtr(int stage)>;
void place_dense_params(ModelInfo& m, const std::map<std::string, ParamInfo>& by_name, const StageRoot& stage_root,
                        const pickle::ValuePtr& osd, const std::string& opt_path);
// AutoEP sources: the groups holding the fused expert weights are the expert groups.
void mark_autoep_expert_groups(ModelInfo& m);
// Pipeline sources: every parameter's layer, local name, transformer and tied flags, and the
// layer-file numbering (the manifest's record, else the pattern set's).
void set_pipeline_positions(ModelInfo& m, const formats::universal::UniversalSource& src, const std::string& manifest_path);

// The vocabulary padding multiple m such that padding `vocab` to a multiple of m * tp gives
// `padded` (largest of 128, 64, ..., 1 that fits; Megatron's make_vocab_size_divisible_by).
int64_t infer_vocab_multiple(int64_t vocab, int64_t padded, int tp);
int64_t pad_vocab(int64_t vocab, int64_t multiple, int tp);

}  // namespace ucpkit::reshard
