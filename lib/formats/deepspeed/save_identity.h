// What identifies one DeepSpeed save across its files: the values every file of one checkpoint
// repeats, so that a file from another step or another run mixed into a folder can be told apart
// from the pickles alone (no tensor data read).
//  * model-states files: DeepSpeed's common state (deepspeed/runtime/engine.py:4897-4919
//    _common_checkpoint_state: skipped_steps, global_steps, global_samples, dp_world_size,
//    mp_world_size, ds_version), Megatron's client state (megatron/checkpointing.py:255-258: args,
//    checkpoint_version, iteration, tokens) and, of `args`, the fields that define the model and the
//    run (those Megatron itself compares when loading, checkpointing.py:43-80 check_checkpoint_args,
//    plus world sizes and progress counters). Not `args.rank` / `local_rank`: they differ per rank
//    (megatron/arguments.py:66).
//  * optimizer shards: ds_version (file root and optimizer_state_dict,
//    deepspeed/runtime/zero/stage_1_and_2.py:2630), under its own field name: compared among the
//    shards, not with the model files (a native-MoE version-line conversion, pec-restore
//    --ds-version, rewrites only the model files' ds_version).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// (field, value rendered as text) for each identity field present in the file, e.g.
// ("iteration", "10"), ("args.hidden_size", "32"), ("ds_version", "'0.16.4'").
using IdentityFields = std::vector<std::pair<std::string, std::string>>;

IdentityFields model_file_identity(const pickle::ValuePtr& root);
IdentityFields optim_file_identity(const pickle::ValuePtr& root);

// A scalar-like value as comparable text: numbers, strings, booleans, None, small tensors (their
// values: a step saved as a 0-d tensor), sequences of those; other values by their repr.
std::string identity_text(const pickle::ValuePtr& v);

}  // namespace ucpkit::formats::deepspeed
