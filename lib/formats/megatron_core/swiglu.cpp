#include "formats/megatron_core/swiglu.h"

#include <string>
#include <vector>

#include "core/error.h"

namespace ucpkit::formats::megatron_core {

Tensor swiglu_tp_local(const Tensor& stored, int64_t tp, int64_t rank) {
  if (stored.dim() < 1 || tp < 1 || rank < 0 || rank >= tp || stored.shape()[0] % (2 * tp) != 0)
    throw Error("SwiGLU linear_fc1: " + std::to_string(stored.dim() ? stored.shape()[0] : 0) +
                " rows do not split into [W; V] over TP " + std::to_string(tp) + " (rank " + std::to_string(rank) + ")");
  const int64_t half = stored.shape()[0] / 2;
  const int64_t part = half / tp;
  return cat({stored.narrow(0, rank * part, part), stored.narrow(0, half + rank * part, part)}, 0);
}

Tensor swiglu_from_tp_locals(const std::vector<Tensor>& locals) {
  std::vector<Tensor> w, v;
  for (const auto& t : locals) {
    if (t.dim() < 1 || t.shape()[0] % 2 != 0)
      throw Error("SwiGLU linear_fc1: a TP-local [W_r; V_r] with an odd number of rows");
    const int64_t part = t.shape()[0] / 2;
    w.push_back(t.narrow(0, 0, part));
    v.push_back(t.narrow(0, part, part));
  }
  w.insert(w.end(), v.begin(), v.end());
  return cat(w, 0);
}

}  // namespace ucpkit::formats::megatron_core
