// What an extract plan takes from its source checkpoint besides the fragments, shared by the
// ZeRO-1/2 and ZeRO-3 planners: the pattern set (an explicit file or the checkpoint's own
// universal_checkpoint_info, formats::deepspeed::universal_checkpoint_info).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "io/pickle/value.h"
#include "formats/deepspeed/file_names.h"
#include "patterns/pattern_set.h"
#include "to_universal/extract.h"

namespace ucpkit::to_universal {

// Patterns: options.patterns_file wins (the checkpoint's vocab sizes added when it lacks them); else
// the checkpoint's universal_checkpoint_info `uc_info`; else none (refused with tp > 1). Sets
// plan.patterns_origin and plan.patterns_json.
patterns::PatternSet choose_patterns(const ExtractOptions& options, const pickle::ValuePtr& uc_info,
                                     const formats::deepspeed::DeepSpeedLayout& L, ExtractPlan& plan);

}  // namespace ucpkit::to_universal
