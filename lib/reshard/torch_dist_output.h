// ucp-load --format torch_dist: a Megatron-Core-named universal folder (docs/formats-megatron-core.md,
// "Universal names") written as a Megatron-Core torch_dist checkpoint with the fully_reshardable
// distributed-optimizer state, as Megatron-LM's save_checkpoint lays it out:
//   OUT/latest_checkpointed_iteration.txt       the iteration (training/checkpointing.py:340)
//   OUT/iter_{N:07d}/.metadata, __{rank}_0.distcp  the DCP save (formats/dcp/writer), keys and chunks
//                                                 per rank of the target mesh (formats/megatron_core/writer)
//   OUT/iter_{N:07d}/metadata.json               {"sharded_backend": "torch_dist", "sharded_backend_version": 1},
//                                                 written last as Megatron does (dist_checkpointing/serialization.py:447-453)
// The common state (the bytes item common_state/shard_0_1: torch.save([dict])) is the folder's
// megatron_core/common_state.pt (ucp-union's record of the source's, in fully_reshardable form) with
// args.{tensor,pipeline,expert}_model_parallel_size, data_parallel_size and world_size set to the
// target; the `._extra_state` objects are written back as recorded. Model tensors in the source's
// dtype (the manifest's) unless --dtype, optimizer states fp32. --tp / --pp / --ep / --dp left out
// are the source's (recorded in manifest.json's source), said on stderr.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "reshard/load.h"

namespace ucpkit::reshard {

// ucp-load --format torch_dist (run_load calls it).
LoadSummary run_torch_dist_load(const LoadOptions& options);

// ucp-load --plan / --dry-run --format torch_dist: target, keys, entries and files; writes nothing.
nlohmann::json torch_dist_plan_json(const LoadOptions& options);

}  // namespace ucpkit::reshard
