// The universal checkpoint's zero/<param>/<state>.pt (fp32, exp_avg, exp_avg_sq) as one struct with a
// reader and a writer: the only code that knows its keys (DeepSpeed checkpoint/constants.py:30-124).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "io/pickle/value.h"
#include "io/tensor.h"
#include "patterns/pattern_set.h"

namespace ucpkit::formats::universal {

// One state file. DeepSpeed writes three forms (line numbers: deepspeed/checkpoint/ds_to_universal.py at
// edaa72212):
//  * a dense parameter, merge_tp_slices (:339-458): {cat_dim, param_n_sub_params | sub_param_shape,
//    vocab_tensor, param}, each key only when its join or the vocabulary pattern sets it, in that order;
//  * an AutoEP expert parameter (_save_zero3_autoep_universal_tensor :705-717, autoep_universal.py:333-338):
//    {param, cat_dim: 0, is_expert_param: True, ep_num_experts: E};
//  * the ZeRO-3 TP = 1 form: the bare 1-D tensor, no dict.
struct StateFile {
  Tensor param;
  bool bare = false;                           // the file is `param` itself
  std::optional<int64_t> cat_dim;              // 'cat_dim'
  std::optional<int64_t> param_n_sub_params;   // 'param_n_sub_params'
  std::optional<patterns::SubParamSpec> sub_param_shape;  // 'sub_param_shape', a deepspeed SubparamShape
  bool vocab_tensor = false;                   // 'vocab_tensor': rows cut to original_vocab_size
  std::optional<int64_t> ep_num_experts;       // 'is_expert_param': True and 'ep_num_experts' (AutoEP)
};

// The pickle root torch.save writes for `f` (keys in DeepSpeed's order for its form).
pickle::ValuePtr to_pickle(const StateFile& f);

// The state file whose torch pickle root is `root`; throws Error naming `path` when it is neither a
// bare tensor nor a dict with a 'param' tensor, or when a known key holds the wrong kind of value.
StateFile read_state_file(const pickle::ValuePtr& root, const std::string& path);

}  // namespace ucpkit::formats::universal
