// Vocabulary padding (the joins themselves are rows of formats/universal/join.cpp).
#include "to_universal/union_fragments.h"

#include "core/error.h"

namespace ucpkit::to_universal {

Tensor strip_padding(const std::string& name, const Tensor& t, int64_t original_vocab_size) {
  const auto mismatch = [&](const std::string& what) { throw Error("parameter " + name + ": " + what); };
  if (t.dim() < 1) mismatch("vocabulary parameter is a scalar");
  if (original_vocab_size > t.shape()[0])
    mismatch("original_vocab_size " + std::to_string(original_vocab_size) + " exceeds its " +
             std::to_string(t.shape()[0]) + " rows");
  if (original_vocab_size == t.shape()[0]) return t;
  return t.narrow(0, 0, original_vocab_size).contiguous(true);
}

}  // namespace ucpkit::to_universal
