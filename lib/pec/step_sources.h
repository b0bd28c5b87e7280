// The training step of a checkpoint, from every place that records it: the tag folder's name
// (`global_step<N>`), the `latest` (or `latest_universal`) file that named the tag, and the
// model-states file's `global_steps` (DeepSpeed's counter, which names the tag) and `iteration`
// (Megatron's). pec-save checks a --step against all of them, or infers it from them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "formats/deepspeed/checkpoint_dir.h"

namespace ucpkit::pec {

struct SourceCheckpoint;

// One place that records the step: its value and where it was read, for messages
// ("the tag folder name global_step300", "<dir>/latest (names global_step300)",
// "global_steps in <file>").
struct StepSource {
  int64_t step = 0;
  std::string where;
};

// N of a tag "global_step<N>" (formats/deepspeed/checkpoint_dir.h).
using formats::deepspeed::step_of_tag;

// Every source the checkpoint has: the tag's name, the pointer file that named it (when the folder
// given was its parent), `global_steps` and `iteration` of its first model-states file (when they are
// integers). Reads only that file's pickle.
std::vector<StepSource> step_sources(const SourceCheckpoint& c);

struct ResolvedStep {
  int64_t step = -1;
  bool inferred = false;  // not given: taken from the sources
  std::string from;       // the sources that agree on it, for the summary ("" when given and none exist)
};

// `given` (>= 0) checked against every source, or (given < 0) the step the sources agree on.
// Throws UsageError when a given step disagrees with a source (naming both values and where the
// source's comes from), or when none is given and no source exists; Error (corrupt input) when the
// sources disagree among themselves and no step is given. `checkpoint` names the folder in messages.
ResolvedStep resolve_step(int64_t given, const std::vector<StepSource>& sources, const std::string& checkpoint);

}  // namespace ucpkit::pec
