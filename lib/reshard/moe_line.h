// ucp-load's native-MoE model files laid out as one DeepSpeed version line writes them
// (layout/deepspeed/version_line.h): which keys, in which order, _metadata on the module, expp files.
#pragma once
#include <string>
#include <vector>

#include "io/pickle/value.h"
#include "formats/deepspeed/version_line.h"

namespace ucpkit::reshard {

// The line to write: `requested` (--ds-version: a line or a release) when given, else the line the
// universal checkpoint recorded (`recorded`, manifest source.ds_line), else the one the template
// model file shows (`template_root`).
const formats::deepspeed::VersionLine& resolve_moe_line(const std::string& requested, const std::string& recorded,
                                            const pickle::ValuePtr& template_root);

struct MoeLineInputs {
  pickle::ValuePtr param_shapes;               // list of every bit16 group's OrderedDict(name -> Size)
  pickle::ValuePtr ds_config;                  // the target's ds_config
  int zero_stage = 1;
  std::vector<std::string> expert_local_names;  // DP rank 0's expert parameters (local indices), module order
  std::string ds_release;                       // ds_version to write when the line has it ("" = the template's
                                                // when it is of the line, else the line's first release)
};

// Rewrites `root` (a copy of the template mp_rank file whose module already holds the target's
// tensors) to `line`'s keys and key order; Megatron's client-state keys follow in template order.
void apply_moe_line(const pickle::ValuePtr& root, const formats::deepspeed::VersionLine& line, const MoeLineInputs& in);

// A minimal ds_config for native MoE targets when the template has none: the layout facts readers
// need (ZeRO stage, precision flags, expert rank order).
pickle::ValuePtr minimal_moe_ds_config(int zero_stage, bool bf16, bool fp16, bool data_before_expert);

}  // namespace ucpkit::reshard

namespace ucpkit::reshard {

// Rewrites the native-MoE checkpoint folder `step_dir` (global_stepN, TP = PP = 1, ZeRO-1/2) in
// place as `line` lays it out: mp_rank_00_model_states.pt (keys, _metadata, views into per-group
// flat buffers or compact copies, param_shapes from the module and expert files by Megatron's
// parameter-group rule) and the expp_rank_* files. The ZeRO shards and expert files are the same in
// every line and are not touched. Returns the line the folder had. Throws Error naming a file.
std::string relayout_moe_folder(const std::string& step_dir, const formats::deepspeed::VersionLine& line);

}  // namespace ucpkit::reshard
