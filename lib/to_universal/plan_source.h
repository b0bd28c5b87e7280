// What an extract plan takes from its source checkpoint besides the fragments, shared by the
// ZeRO-1/2 and ZeRO-3 planners: the pattern set (an explicit file or the checkpoint's own
// universal_checkpoint_info), the model-parallel world sizes the model states record checked against
// the file names, and the AutoEP layers as plan.source lists them.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"
#include "formats/deepspeed/autoep.h"
#include "formats/deepspeed/file_names.h"
#include "patterns/pattern_set.h"
#include "to_universal/extract.h"

namespace ucpkit::to_universal {

// Patterns: options.patterns_file wins (the checkpoint's vocab sizes added when it lacks them); else
// the checkpoint's universal_checkpoint_info `uc_info`; else none (refused with tp > 1). Sets
// plan.patterns_origin and plan.patterns_json.
patterns::PatternSet choose_patterns(const ExtractOptions& options, const pickle::ValuePtr& uc_info,
                                     const formats::deepspeed::DeepSpeedLayout& L, ExtractPlan& plan);

// mp_world_size and Megatron's args (tensor/pipeline_model_parallel_size) of the model states `root`
// against the degrees the file names give. Throws Error naming `path`.
void check_model_parallel_sizes(const pickle::ValuePtr& root, const std::string& path, const formats::deepspeed::DeepSpeedLayout& L);

// The AutoEP layers as the manifest lists them under source.autoep.
nlohmann::json autoep_source_json(const std::vector<formats::deepspeed::AutoEpLayer>& autoep);

}  // namespace ucpkit::to_universal
