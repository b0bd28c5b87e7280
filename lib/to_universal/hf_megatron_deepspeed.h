// A Hugging Face import as a fresh Megatron-DeepSpeed run holds it (docs/hf.md "Megatron-DeepSpeed output"):
// its GPT's parameter names (and layer numbering), one mp_rank_00 model file at TP = PP = DP = 1 (Megatron
// args from the import's config facts, iteration 0, no scheduler, sampler or RNG state), DeepSpeed's universal
// optimizer state with Megatron's two param groups. It is the template `--to-names megatron-deepspeed` renames
// the import's Megatron-Core-named universal folder with (to_universal/megatron_core_names.h), so ucp-load
// --format deepspeed lays the weights out at any TP / PP / DP like any Megatron-DeepSpeed universal folder.
// The fresh run has no history to carry, which is why a real run's folder is refused as such a template.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "formats/universal/manifest.h"
#include "io/dtype.h"
#include "io/pickle/value.h"

namespace ucpkit::to_universal {

struct FreshMegatronDeepSpeed {
  formats::universal::UniversalManifest manifest;  // GPTModelPipe names, tp_shapes at TP 1, state files named
  pickle::ValuePtr model_states;                   // mp_rank_00_model_states.pt
  pickle::ValuePtr optimizer_state;                // zero/optimizer_state.pt
};

// `facts`: formats/megatron_core/model_facts.h's, of the import's common state; `vocab`: the vocabulary rows;
// `dtype`: the model's; `param_groups`: the import's Megatron param groups (weight decay first, then none),
// whose hyper-parameters are kept; `where` names the import in errors. Plain data. Refuses (Error naming
// `where` and the reason) a model GPTModelPipe does not compute with these weights: MoE, linear or QKV biases,
// q/k norms, Llama 3 rope scaling, a rope theta that is not an integer,
// dense layers between MoE layers, a shared expert, the router's softmax before the top k. Dense models become
// GPTModelPipe (any TP / PP), MoE models GPTModel with native DeepSpeed MoE (TP = PP = 1, any EP).
FreshMegatronDeepSpeed fresh_megatron_deepspeed(const nlohmann::json& facts, int64_t vocab, DType dtype,
                                                const pickle::ValuePtr& param_groups, const std::string& where);

// fresh_megatron_deepspeed's refusals for Hugging Face folder `hf_folder` (its config.json facts, naming the folder),
// before anything is converted.
void check_hf_megatron_deepspeed(const std::string& hf_folder);

// Whether universal folder manifest `m` is a Hugging Face import in Megatron-Core names (ucp-union of a Hugging
// Face folder), which has no Megatron-DeepSpeed record of its own.
bool is_hf_import(const formats::universal::UniversalManifest& m);

// fresh_megatron_deepspeed of the import at `imported` (is_hf_import), written into `dir` as a template folder:
// manifest.json, the model file, zero/optimizer_state.pt; no state files (the import's travel).
void write_fresh_megatron_deepspeed(const std::string& imported, const std::string& dir);

}  // namespace ucpkit::to_universal
