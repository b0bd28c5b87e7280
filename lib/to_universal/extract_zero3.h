// The extract plan of a ZeRO-3 checkpoint: every parameter is split on its own into ceil(numel/dp)
// slices (padding at the end); a rank's flat sub-group is the concatenation of its slices, in
// param_shapes order. With tensor parallelism (Megatron-DeepSpeed, AutoTP) each TP rank t writes its
// own zero_pp_rank_<dp>_mp_rank_<t>_* files whose param_shapes are that rank's TP-slice shapes: the
// TP slice is assembled from its DP slices, then the slices are joined across TP by the patterns as
// for ZeRO-1/2 (what ds_to_universal's merge_tp_slices does for stage 3 with tp_degree > 1). AutoEP
// under ZeRO-3 (partition-native, docs/formats.md "AutoEP under ZeRO-3") partitions its expert
// sub-groups over the expert-DP group.
#pragma once
#include "formats/deepspeed/file_names.h"
#include "to_universal/extract.h"

namespace ucpkit::to_universal {

// Reads every DP rank's model file (save identity, AutoEP places), each TP rank's param_shapes and
// every optimizer shard; the slices are mapped by to_universal/fragment_map.h. Throws Error naming the file.
ExtractPlan plan_zero3(const formats::deepspeed::DeepSpeedLayout& L, const ExtractOptions& options);

}  // namespace ucpkit::to_universal
