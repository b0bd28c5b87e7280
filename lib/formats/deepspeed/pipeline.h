// PipelineModule (DeepSpeed pipeline parallelism) layout facts shared by the reader (ucp-union /
// ucp-extract) and the writer (ucp-load): the layer_NN numbering of the layer files, where tied
// modules sit in the registration order (and so in every flat ZeRO buffer), and which world size
// `mp_world_size` records. Sources (deepspeedai/DeepSpeed v0.19.5-27, edaa722):
// * layer files: `layer_{idx:02d}-model_{tp:02d}-model_states.pt` with idx the spec index of the
//   PipelineModule layer (deepspeed/runtime/pipe/module.py:588-596 ckpt_layer_path; the loader globs
//   `layer_{idx:02d}-*model_states.pt`, :598-605 ckpt_layer_path_list). A TiedLayerSpec is saved under
//   the index of each spec that uses it, so a tied embedding has a file at the embedding's index on
//   the first stage and at the head's index on the last stage.
// * registration order: `self.tied_modules = nn.ModuleDict()` is created in __init__ (module.py:196)
//   before _build registers numbered layers with add_module(str(idx), ...) (:255, :277), so a stage's
//   parameters list its tied modules first; Megatron's param groups and ZeRO's flat buffers follow
//   module order.
// * mp_world_size (engine.py:1841 groups._get_model_parallel_world_size -> mpu): under the
//   PipelineEngine the mpu is the PipelineParallelGrid, whose model-parallel group is every rank of
//   one data-parallel index (pipe/topology.py:304-313): PP x TP; otherwise Megatron's mpu: TP.
//   MegatronSDLoader.check_ckpt_list compares it with the number of mp_rank files
//   (runtime/state_dict_factory.py:166-175).
#pragma once
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace ucpkit::formats::deepspeed {

// Which layer_NN index holds what. Blocks are the numbered layers with attention; the tied embedding
// (tied_modules.*) carries no index in its names, so its file numbers must be recorded.
struct PipelineNumbering {
  int embedding = -1;   // layer_NN of the embedding spec (first stage); -1: no tied module
  int tied_head = -1;   // layer_NN of the tied head spec (last stage); -1: none
  int first_block = -1, last_block = -1;
  int final_norm = -1;  // first numbered layer after the last block; -1: none
  std::string origin;   // "checkpoint" (read from layer files) or "patterns" (the family's pattern file)

  bool operator==(const PipelineNumbering&) const = default;
};

nlohmann::json to_json(const PipelineNumbering& n);
// Throws Error naming `where` when a field is missing or not an integer.
PipelineNumbering pipeline_numbering_from_json(const nlohmann::json& j, const std::string& where);

// From a source checkpoint: `layer_keys` maps every layer_NN index present to the keys of its
// (TP rank 0) file; `numbered` are the layer indices that appear in parameter names (<idx>.<local>),
// `blocks` those of transformer blocks; `tied_locals` the local names of tied_modules.* parameters
// (after `tied_modules.<key>.`). The embedding is the first file holding a tied local name, the tied
// head the last one (PP = 1 saves both specs too). Throws Error when a tied module is in no file.
PipelineNumbering detect_pipeline_numbering(const std::map<int, std::vector<std::string>>& layer_keys,
                                            const std::set<int>& numbered, const std::set<int>& blocks,
                                            const std::set<std::string>& tied_locals);

// From a model family's pattern file (patterns/*.json, key "pipeline_numbering":
// {"embedding": E, "tied_head_after_last_block": K}) and the block indices of the names; nullopt-like
// result (embedding = -1) when the pattern file says nothing.
PipelineNumbering pipeline_numbering_from_patterns(const nlohmann::json& pattern_set, const std::set<int>& numbered,
                                                   const std::set<int>& blocks);

// Splits a pipeline parameter name: "<idx>.<local>" -> (idx, local); "tied_modules.<key>.<local>" ->
// (-1, local); anything else -> (-2, ""): not a PipelineModule name.
std::pair<int, std::string> split_pipeline_name(const std::string& name);
// A transformer block's parameter (its local name has an attention module): what is balanced over stages.
bool is_block_local(const std::string& local);

// PipelineModule registers tied modules before the numbered layers (module.py:196 vs :255/:277).
constexpr bool kTiedModulesFirst = true;

// The mp_world_size a model-states file records: PP x TP for a PipelineModule, TP otherwise.
int mp_world_size(int tp, int pp, bool pipeline_module);

}  // namespace ucpkit::formats::deepspeed
