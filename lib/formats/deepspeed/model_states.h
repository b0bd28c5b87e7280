// One DeepSpeed model-states file as a typed model: mp_rank_XX_model_states.pt,
// zero_pp_rank_D_mp_rank_XX_model_states.pt (ZeRO-3), and, as far as their module dict goes, the
// pipeline's layer_XX-model_YY files and native MoE's layer_M_expert_G files. One reader, two
// writers: the file as read (keys in file order), or laid out as one DeepSpeed version line writes
// it (version_line.h: keys, key order, module _metadata). The only code that knows the keys.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/version_line.h"
#include "io/pickle/value.h"

namespace ucpkit {
struct TorchFile;
}

namespace ucpkit::formats::deepspeed {

// param_shapes: per bit16 param group (ZeRO-3: per sub-group), name -> shape in flat-buffer order
// (engine.py _get_zero_param_shapes).
using ParamShapes = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;

struct ModelStates {
  // Every tensor of the module under its flat name (module_tree.h), in file order.
  std::vector<std::pair<std::string, pickle::ValuePtr>> module;
  // The module as saved: Megatron's nesting, torch's _metadata, non-tensor entries. The writers put
  // `module`'s values back into a copy of it by name. Layer and expert files are this dict alone.
  pickle::ValuePtr tree;
  bool module_only = false;  // a layer or expert file: the whole file is the module dict

  std::optional<ParamShapes> param_shapes;
  std::optional<int64_t> dp_world_size, mp_world_size;
  pickle::ValuePtr ds_config;             // DeepSpeed's config dict; null when the file has none
  std::optional<std::string> ds_version;  // from 0.19.3 on in native-MoE files, always in dense ones

  // Every entry in file order. The keys above have a null value here (their field holds it; a field
  // read in another form stays here, and a field set later wins over it); the others are DeepSpeed's remaining keys (buffer_names, lr_scheduler, num_experts, ...) and the
  // client state (is_deepspeed_model_key false: Megatron's args, iteration, rng_state, ...).
  std::vector<std::pair<std::string, pickle::ValuePtr>> entries;
  bool ordered = false;  // the root was an OrderedDict

  // Native MoE, 0.14 line: DP rank 0's expert parameters (local names) in module order. Megatron
  // pops them from 'language_model.encoder' after state_dict() ran (language_model.py:628-631), so
  // that dict's _metadata still lists them.
  std::vector<std::string> expert_param_names;

  // An entry without a field (nullptr when absent), and setting one (appended when new).
  pickle::ValuePtr get(const std::string& key) const;
  void set(const std::string& key, pickle::ValuePtr value);
  bool contains(const std::string& key) const;
  // Megatron's argparse.Namespace (client state 'args'); null when absent.
  pickle::ValuePtr args() const { return get("args"); }
  // The client state, in file order.
  std::vector<std::pair<std::string, pickle::ValuePtr>> client_state() const;
};

// The training steps a model-states file records, with the key that holds each: DeepSpeed's
// global_steps (engine.py save_checkpoint's state dict) and Megatron's iteration (client state), when
// present as non-negative integers, in that order.
std::vector<std::pair<std::string, int64_t>> recorded_steps(const ModelStates& m);

// The `ds_version` string DeepSpeed records at the root of a model-states file or an optimizer shard
// (engine.py _save_checkpoint / _save_zero_checkpoint); "" when the root has none.
std::string ds_version_of(const pickle::ValuePtr& root);

// Reads a model-states root (`path` names the file in errors). Values are shared with `root`, not
// copied: change a copy (pickle::deep_copy) when the root must stay as it is.
ModelStates read_model_states(const pickle::ValuePtr& root, const std::string& path);
ModelStates read_model_states(const TorchFile& file, const std::string& path);
// An mp_rank_XX / zero_pp_rank_D_mp_rank_XX model-states file: read_model_states, and a root without
// DeepSpeed's module entry (engine.py _save_checkpoint always saves one, None in a pipeline's) is
// refused naming `path` instead of being read as a bare layer or expert dict.
ModelStates read_rank_model_states(const pickle::ValuePtr& root, const std::string& path);

// The file as read: every entry in `entries` order, typed fields in their place.
pickle::ValuePtr to_pickle(const ModelStates& m);
// The file as `line` writes it: line.mp_rank_keys in order (a key the model lacks gets what the
// line's save code puts there), then the client state in file order; module tensors as they are,
// _metadata added or dropped as the line does. ds_version: the model's when it belongs to `line`,
// else the line's first release.
pickle::ValuePtr to_pickle(const ModelStates& m, const VersionLine& line);

// A parameter of one ZeRO-1/2 bit16 group: its module name, shape and element offset in the group's
// flat buffer.
struct GroupMember {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
};
// The module tensors of one bit16 group as DeepSpeed saves them: before 0.17.1 views into the group's
// one flat buffer (bit16_groups_flat, padded to 2 * DP, stage_1_and_2.py:354-357), the storage
// flat() gives; from 0.17.1 on (`compact_copies`: clone_tensors_for_torch_save,
// checkpoint/utils.py:41-65) each its own compact tensor, compact(k) for member k. In member order.
std::vector<pickle::ValuePtr> bit16_group_tensors(bool compact_copies, const std::vector<GroupMember>& members,
                                                  const std::function<Tensor(size_t)>& compact,
                                                  const std::function<std::shared_ptr<Storage>()>& flat);

// The parallel layout a written file describes, as model states and their ds_config / Megatron
// args record it.
struct LayoutFacts {
  int tp = 1, pp = 1, dp = 1, ep = 1, zero_stage = 1;
  int64_t sub_group_size = 1000000000;  // ZeRO-3 zero_optimization.sub_group_size
  DType dtype = DType::BFloat16;        // low-precision weights: fp16 / bf16 flags, params_dtype
  int64_t padded_vocab = 0;             // Megatron's padded_vocab_size (0: left as it is)
  int source_dp = 0;                    // the source's DP size: train_batch_size scales with DP (0: left)
  bool autoep = false;                  // expert_parallel.autoep_size is the EP size (AutoEP)
};

// A copy of ds_config `source` describing `t`: ZeRO stage (sub_group_size only at stage 3),
// precision flags, train_batch_size, AutoEP size. A value that is not a dict is returned as it is.
pickle::ValuePtr retarget_ds_config(const pickle::ValuePtr& source, const LayoutFacts& t);
// Megatron's args (an argparse.Namespace) set to `t` in place where it has the field: parallel
// sizes, world size, ZeRO stage, EP size, padded vocabulary, dtype flags.
void retarget_megatron_args(const pickle::ValuePtr& args, const LayoutFacts& t);

// What a model-states file records of the layout, set to `t` where the file has the key:
// dp_world_size, mp_world_size (`mp_world_size`, pipeline.h), checkpoint_parallel_dimensions,
// ds_config, Megatron's args, universal_checkpoint_info's padded_vocab_size.
void retarget_layout(ModelStates& m, const LayoutFacts& t, int mp_world_size);
// AutoEP: ds_autoep_layers (top level and in universal_checkpoint_info) for `t` and this file's EP
// place (autoep.h retarget_autoep_layers); frozen-parameter entries of t's ZeRO stage where the file
// has them in the other form.
void retarget_autoep(ModelStates& m, const LayoutFacts& t, int ep_rank, int expert_dp_rank);
// frozen_param_shapes / frozen_param_fragments as save_frozen_param (= partition_gradients, ZeRO >= 2,
// engine.py v0.19.5:5097) writes them at `zero_stage`, {} or None, where the file has none (what a
// version line's save code adds) or has them in the form of another stage (a template of the source's).
void add_frozen_params(ModelStates& m, int zero_stage);

// A minimal ds_config for native-MoE targets when the template has none: the layout facts readers
// need (ZeRO stage, precision flags, expert rank order).
pickle::ValuePtr minimal_moe_ds_config(int zero_stage, bool bf16, bool fp16, bool data_before_expert);

// Raw-root accessors for readers that walk a model-states root themselves (the key names stay here):
// the value under DeepSpeed's key, or null when absent. raw_ds_version also reads an optimizer file's
// root or a universal optimizer_state.pt.
pickle::ValuePtr raw_param_shapes(const pickle::ValuePtr& root);
pickle::ValuePtr raw_ds_config(const pickle::ValuePtr& root);
pickle::ValuePtr raw_dp_world_size(const pickle::ValuePtr& root);
pickle::ValuePtr raw_mp_world_size(const pickle::ValuePtr& root);
pickle::ValuePtr raw_ds_version(const pickle::ValuePtr& root);
// Whether the file as read had the key (a writer keeps what the source had).
bool had_param_shapes(const ModelStates& m);
bool had_ds_config(const ModelStates& m);

// The mp_rank_00_model_states.pt the DeepSpeed engine saves (0.19.8 runtime/engine.py _common_checkpoint_state
// :5017-5038, from _save_checkpoint :5377) around a plain torch module no step has trained yet, one rank: module = the parameters
// `shapes` names (one optimizer group, in named_parameters order; 0-element placeholders of `dtype` the
// writer fills), no buffers, frozen or shared parameters, scheduler or sampler, steps 0, and a ds_config
// of `zero_stage` and the precision flags of `dtype`. What a universal folder made from a Hugging Face
// folder carries as its template (to_universal from_hf_engine.cpp).
// `tied`: module entries that share a parameter's storage (alias, parameter), after the parameters in the module and
// in shared_params (a tied lm_head.weight, engine.py :5490 _get_shared_params).
ModelStates fresh_engine_model_states(const ParamShapes& shapes, DType dtype, int zero_stage, const std::string& ds_version,
                                      const std::vector<std::pair<std::string, std::string>>& tied = {});
// shared_params of a model-states file: module entries that are another parameter's tensor (alias, parameter), as
// the engine records tied weights (engine.py v0.19.8 _get_shared_params); empty when absent or not str -> str.
std::vector<std::pair<std::string, std::string>> shared_params(const ModelStates& m);

// ---- What the extract planner and PEC read of a model-states file beyond the typed fields (the key
// names stay here).
// Megatron-DeepSpeed's universal_checkpoint_info (pattern categories, vocab sizes); null when absent.
pickle::ValuePtr universal_checkpoint_info(const ModelStates& m);
// num_experts (native MoE and AutoEP): experts per MoE layer; empty when absent or not a list.
std::vector<int> num_experts(const ModelStates& m);
// Whether ds_autoep_layers is there and not None: an AutoEP save (engine.py:4986-5017).
bool has_autoep_layers(const ModelStates& m);
// ds_autoep_layers parsed and checked (autoep.h parse_autoep_layers, errors name `path`); empty when
// absent or None.
std::vector<AutoEpLayer> autoep_layers(const ModelStates& m, const std::string& path);
// The expert/data rank order an AutoEP model file's ds_config records (use_data_before_expert_parallelism,
// ds_to_universal.py:877); nullopt when not recorded. A value that is not a boolean: Error naming `path`.
std::optional<bool> autoep_data_before_expert(const ModelStates& m, const std::string& path);

// param_shapes however it was saved: the typed field, or an untyped list (or tuple) of dicts
// name -> shape, or one dict name -> shape (`one_dict`). `not_dicts` counts list entries that are not
// dicts (left out of `groups`). nullopt when the file has none or it is of another form.
struct SavedParamShapes {
  ParamShapes groups;
  bool one_dict = false;
  size_t not_dicts = 0;
};
std::optional<SavedParamShapes> saved_param_shapes(const ModelStates& m);

// The model-parallel sizes the file records, against `tp` and `pp` from the file names: mp_world_size
// (tp, or tp * pp) and Megatron's args tensor/pipeline_model_parallel_size. Throws Error naming `path`
// ("inconsistent world sizes: ...").
void check_recorded_parallel_sizes(const ModelStates& m, const std::string& path, int tp, int pp);

}  // namespace ucpkit::formats::deepspeed
