// Storage location tags (the `location` of torch.save's persistent ids: "cpu", "cuda:3") of the
// files DeepSpeed writes. ds_to_universal loads every shard with map_location='cpu'
// (deepspeed/checkpoint/ds_to_universal.py:177, :878) and saves what it derives from them
// (step.pt :331, zero/optimizer_state.pt :873-883), so those carry "cpu"; DeepSpeed's universal
// loader reads them with a bare torch.load (no map_location), which fails on a host without the GPU a
// "cuda:N" tag names. The mp_rank model files are byte copies (shutil.copy2, :1104) and keep the
// source's tags.
#pragma once
#include "io/pickle/value.h"

namespace ucpkit::formats::deepspeed {

// Sets the location of every tensor storage reachable from `v` (dicts, lists, tuples, objects'
// state) to "cpu". Returns how many storages were re-tagged.
size_t tag_storages_cpu(const pickle::ValuePtr& v);

}  // namespace ucpkit::formats::deepspeed
