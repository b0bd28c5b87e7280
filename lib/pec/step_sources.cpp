// A checkpoint's step from its tag, `latest` and model-states file; checked or inferred.
#include "pec/step_sources.h"

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "formats/deepspeed/file_names.h"
#include "formats/deepspeed/model_states.h"
#include "io/pickle/value.h"
#include "io/torch/torch_file.h"
#include "pec/checkpoint.h"

namespace fs = std::filesystem;

namespace ucpkit::pec {
namespace {

// The model-states file whose common state records the step: DeepSpeed's first model file (ZeRO-3's
// rank-0 one), or the one a universal folder keeps.
std::string model_states_file(const SourceCheckpoint& c) {
  for (const std::string& name : {formats::deepspeed::model_states_name(0), formats::deepspeed::zero3_model_states_name(0, 0)})
    for (const auto& rel : c.non_expert_files)
      if (rel == name) return (fs::path(c.root) / rel).string();
  return {};
}

// "A, B, C": where the sources were read.
std::string places(const std::vector<StepSource>& sources) {
  std::string s;
  for (const auto& x : sources) s += (s.empty() ? "" : ", ") + x.where;
  return s;
}

// "step 300 from A, B; step 200 from C": the sources grouped by the step they record, in order.
std::string described(const std::vector<StepSource>& sources) {
  std::vector<std::pair<int64_t, std::string>> groups;
  for (const auto& x : sources) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& p) { return p.first == x.step; });
    if (g == groups.end())
      groups.emplace_back(x.step, "step " + std::to_string(x.step) + " from " + x.where);
    else
      g->second += ", " + x.where;
  }
  std::string s;
  for (const auto& [step, text] : groups) s += (s.empty() ? "" : "; ") + text;
  return s;
}

}  // namespace

std::vector<StepSource> step_sources(const SourceCheckpoint& c) {
  std::vector<StepSource> out;
  if (auto s = step_of_tag(c.tag)) {
    out.push_back({*s, "the tag folder name " + c.tag});
    if (!c.pointer.empty()) out.push_back({*s, c.pointer + " (names " + c.tag + ")"});
  }
  const std::string model = model_states_file(c);
  if (model.empty()) return out;
  for (const auto& [key, step] : formats::deepspeed::recorded_steps(formats::deepspeed::read_model_states(load_torch(model), model)))
    out.push_back({step, key + " in " + model});
  return out;
}

ResolvedStep resolve_step(int64_t given, const std::vector<StepSource>& sources, const std::string& checkpoint) {
  ResolvedStep r;
  r.step = given;
  if (given >= 0) {
    std::vector<StepSource> disagree;
    for (const auto& s : sources)
      if (s.step != given) disagree.push_back(s);
    if (!disagree.empty())
      throw UsageError("--step " + std::to_string(given) + " disagrees with the checkpoint " + checkpoint + ": " +
                       described(disagree) + " (leave --step out to take the checkpoint's)");
    r.from = places(sources);
    return r;
  }
  if (sources.empty())
    throw UsageError("--step is required: " + checkpoint +
                     " records no step (no global_step<N> tag, `latest`, global_steps or iteration)");
  for (const auto& s : sources)
    if (s.step != sources.front().step) fail(checkpoint, "the checkpoint's records of its step disagree: " + described(sources));
  r.step = sources.front().step;
  r.inferred = true;
  r.from = places(sources);
  return r;
}

}  // namespace ucpkit::pec
