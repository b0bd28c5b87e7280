// The source side of an extract plan (see plan_source.h).
#include "to_universal/plan_source.h"

#include <fstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "to_universal/value_json.h"

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

patterns::PatternSet choose_patterns(const ExtractOptions& options, const ValuePtr& uc_info, const formats::deepspeed::DeepSpeedLayout& L,
                                     ExtractPlan& plan) {
  nlohmann::json pj;
  if (!options.patterns_file.empty()) {
    const std::string text = read_text_file(options.patterns_file, "pattern file");
    try {
      pj = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw Error(options.patterns_file + ": not valid JSON: " + e.what());
    }
    plan.patterns_origin = options.patterns_file;
    if (uc_info) {
      auto info = value_to_json(uc_info);
      for (const char* k : {"original_vocab_size", "padded_vocab_size"})
        if (!pj.contains(k) && info.contains(k)) pj[k] = info[k];
    }
  } else if (uc_info && uc_info->kind == Kind::Dict) {
    pj = value_to_json(uc_info);
    plan.patterns_origin = "checkpoint";
  } else {
    if (L.tp > 1)
      throw UsageError(L.model_files[0] + ": no universal_checkpoint_info in the checkpoint and tp=" +
                       std::to_string(L.tp) + ": pass --patterns <patterns/*.json>");
    pj = nlohmann::json::object();
    plan.patterns_origin = "none";
  }
  patterns::PatternSet pset = patterns::PatternSet::from_json(pj, plan.patterns_origin);
  plan.patterns_json = pset.to_json();
  // A pattern file's PipelineModule layer numbering travels with the set (ucp-load's fallback when
  // the layer files say nothing, formats/deepspeed/pipeline.h).
  if (pj.is_object() && pj.contains("pipeline_numbering")) plan.patterns_json["pipeline_numbering"] = pj["pipeline_numbering"];
  return pset;
}

}  // namespace ucpkit::to_universal
