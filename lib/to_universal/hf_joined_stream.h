// An import parameter's fp32 value (hf_joined_value's: the Hugging Face tensors the map names, joined and upcast)
// made on demand, window by window, from the rows where they lie in the mapped safetensors shards: a generated
// tensor (io/generated_view.h) whose writer asks only for the bytes it writes. A torch_dist import thus never holds
// a whole parameter (a Qwen3-MoE embedding is 1.2 GB in fp32), and each MPI rank reads only its own chunks' rows.
#pragma once
#include "formats/hf/folder.h"
#include "formats/hf/import_plan.h"
#include "io/tensor.h"

namespace ucpkit::to_universal {

// Equal, value for value, to hf_joined_value(folder, plan, p): the same rows in the same order (sources one after
// another, element `index` of a fused tensor, a QKV's rows regrouped per query group), each converted as Tensor::to
// converts; the pages of the rows read are dropped once converted. Throws Error naming the folder and tensor for a
// source that is not a floating weight or whose rows do not make p's shape.
Tensor hf_joined_stream(const formats::hf::Folder& folder, const formats::hf::ImportPlan& plan,
                        const formats::hf::ImportParam& p);

}  // namespace ucpkit::to_universal
