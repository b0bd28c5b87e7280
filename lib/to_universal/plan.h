// The extraction plan (the map phase's output): for every parameter, which fragments of which
// shard files make up each tensor-parallel slice. Plain data, printable as JSON.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/universal/manifest.h"
#include "patterns/pattern_set.h"

namespace ucpkit::to_universal {

// One contiguous run of a flat ZeRO partition (or a whole work-folder fragment file).
struct SourceFragment {
  int file = -1;       // index into ExtractPlan::files
  int group = -1;      // optimizer param group; -1: a work-folder file whose root dict maps state -> 1-D tensor
  int64_t offset = 0;  // element offset in the partition
  int64_t numel = 0;
  int part = 0;        // partition index: DP rank (expert groups: expert-DP rank)
};

struct ParamPlan {
  std::string name;                                // universal name (global expert ids)
  std::vector<std::vector<int64_t>> tp_shapes;     // per TP rank
  std::vector<std::vector<SourceFragment>> fragments;    // per TP rank, in partition order
  std::vector<std::string> states;                 // "fp32" first, then optimizer tensor states
  int step_file = -1, step_group = -1;             // where the step value lives (group -1: root["step"])
  int pp_stage = 0;
  int moe_layer = -1, expert = -1;                 // native MoE experts
  int autoep_experts = 0;                          // AutoEP fused expert weight: E (fragments of all EP
                                                   // ranks in part order give [E, ...]); 0 otherwise
  int64_t numel() const;                           // over all TP slices
  uint64_t bytes_in() const { return static_cast<uint64_t>(numel()) * 4 * states.size(); }
};

struct ExtractPlan {
  formats::universal::UniversalSource source;  // the source checkpoint's description
  nlohmann::json patterns_json;           // the pattern set used (PatternSet::to_json)
  std::string patterns_origin;
  std::vector<std::string> files;         // shard or fragment files
  std::vector<ParamPlan> params;
  std::vector<std::string> model_files;   // copied byte for byte into the output
  std::string optimizer_state_file;       // rank-0 optimizer shard, or a prepared optimizer_state.pt
  bool optimizer_state_prepared = false;
  std::vector<std::string> unused_patterns;

  // Appends a file to `files`; returns its index (what fragments and groups refer to).
  int add_file(const std::string& path) {
    files.push_back(path);
    return static_cast<int>(files.size()) - 1;
  }
  nlohmann::json to_json() const;
  // `file` names the plan in errors.
  static ExtractPlan from_json(const nlohmann::json& j, const std::string& file = "plan.json");
  patterns::PatternSet pattern_set() const;
};

// Turns a parameter name into a file-system-safe folder name (names with '/' are rare but legal).
std::string param_folder(const std::string& name);

}  // namespace ucpkit::to_universal
