// The source side of an extract plan (see plan_source.h).
#include "to_universal/plan_source.h"

#include <fstream>

#include "formats/deepspeed/model_states.h"
#include "core/error.h"
#include "to_universal/value_json.h"

namespace ucpkit::to_universal {

using pickle::Kind;
using pickle::ValuePtr;

void check_model_parallel_sizes(const ValuePtr& root, const std::string& path, const formats::deepspeed::DeepSpeedLayout& L) {
  if (auto v = formats::deepspeed::raw_mp_world_size(root); v && !v->is_none() && v->as_int() != L.tp && v->as_int() != L.tp * L.pp)
    fail(path, "inconsistent world sizes: mp_world_size is " + std::to_string(v->as_int()) + " but the files say tp=" +
                   std::to_string(L.tp));
  if (auto args = root->get("args"); args && args->kind == Kind::Object) {
    auto check = [&](const char* field, int expect) {
      if (auto a = args->attr(field); a && a->kind == Kind::Int && a->i != expect)
        fail(path, std::string("inconsistent world sizes: args.") + field + " is " + std::to_string(a->i) +
                       " but the files say " + std::to_string(expect));
    };
    check("tensor_model_parallel_size", L.tp);
    check("pipeline_model_parallel_size", L.pp);
  }
}

patterns::PatternSet choose_patterns(const ExtractOptions& options, const ValuePtr& uc_info, const formats::deepspeed::DeepSpeedLayout& L,
                                     ExtractPlan& plan) {
  nlohmann::json pj;
  if (!options.patterns_file.empty()) {
    std::ifstream in(options.patterns_file);
    if (!in) throw Error(options.patterns_file + ": cannot read pattern file");
    try {
      in >> pj;
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

nlohmann::json autoep_source_json(const std::vector<formats::deepspeed::AutoEpLayer>& autoep) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& a : autoep)
    layers.push_back({{"moe_layer_id", a.moe_layer_id}, {"module_path", a.module_path},
                      {"expert_key_prefix", a.expert_key_prefix}, {"num_experts", a.num_experts},
                      {"num_local_experts", a.num_local_experts}, {"ep_size", a.ep_size}});
  return layers;
}

}  // namespace ucpkit::to_universal
