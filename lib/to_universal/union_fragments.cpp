// Pattern-aware joins of tensor-parallel slices (formats.md section 4 rule order).
#include "to_universal/union_fragments.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "io/shape.h"

namespace ucpkit::to_universal {

using patterns::JoinKind;

namespace {

[[noreturn]] void mismatch(const std::string& name, const std::string& what) {
  throw Error("parameter " + name + ": " + what);
}

void same_shapes(const std::string& name, const std::vector<Tensor>& s) {
  for (size_t i = 1; i < s.size(); ++i)
    if (s[i].shape() != s[0].shape())
      mismatch(name, "shape mismatch between fragments: tp rank 0 has " + shape_str(s[0].shape()) + ", tp rank " +
                         std::to_string(i) + " has " + shape_str(s[i].shape()));
}

void check_cat(const std::string& name, const std::vector<Tensor>& s, int64_t dim) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].dim() <= dim)
      mismatch(name, "tp rank " + std::to_string(i) + " slice " + shape_str(s[i].shape()) + " has no dim " +
                         std::to_string(dim));
    for (int64_t d = 0; d < s[i].dim(); ++d)
      if (d != dim && (s[i].dim() != s[0].dim() || s[i].shape()[d] != s[0].shape()[d]))
        mismatch(name, "shape mismatch between fragments: " + shape_str(s[0].shape()) + " vs " +
                           shape_str(s[i].shape()) + " (joined along dim " + std::to_string(dim) + ")");
  }
}

template <typename F>
void for_each_float(const Tensor& t, F f) {
  if (t.dtype() != DType::Float32) throw Error("internal: expected float32");
  auto b = t.contiguous_bytes();
  const float* p = reinterpret_cast<const float*>(b.data());
  for (int64_t i = 0; i < t.numel(); ++i) f(i, p[i]);
}

Tensor replicate(const std::string& name, const std::vector<Tensor>& s, const UnionOptions& o) {
  same_shapes(name, s);
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i].equal(s[0])) continue;
    if (o.tolerance > 0 && s[0].dtype() == DType::Float32 && s[i].dtype() == DType::Float32) {
      auto a = s[0].contiguous(), b = s[i].contiguous();
      const float* pa = reinterpret_cast<const float*>(a.contiguous_bytes().data());
      const float* pb = reinterpret_cast<const float*>(b.contiguous_bytes().data());
      double worst = 0;
      for (int64_t k = 0; k < a.numel(); ++k) worst = std::max(worst, (double)std::fabs(pa[k] - pb[k]));
      if (worst <= o.tolerance) continue;
      mismatch(name, "TP-replicated copies differ: tp rank " + std::to_string(i) + " differs from rank 0 by up to " +
                         std::to_string(worst) + " (> --tolerance " + std::to_string(o.tolerance) + ")");
    }
    mismatch(name, "TP-replicated copies differ between tp rank 0 and tp rank " + std::to_string(i) +
                       " (use --tolerance to accept drifted replicas)");
  }
  return s[0];
}

Tensor average(const std::string& name, const std::vector<Tensor>& s) {
  same_shapes(name, s);
  if (s[0].dtype() != DType::Float32) mismatch(name, "averaging needs float32 slices");
  // Same arithmetic as Python's sum(slices) / len(slices) in float32: sum() starts from the int 0,
  // so the accumulator starts at +0.0 (0 + -0.0 is +0.0), adds left to right, then divides.
  std::vector<float> acc(static_cast<size_t>(s[0].numel()), +0.0f);
  for (size_t i = 0; i < s.size(); ++i)
    for_each_float(s[i].contiguous(), [&](int64_t k, float v) { acc[k] = acc[k] + v; });
  const float n = static_cast<float>(s.size());
  for (auto& v : acc) v = v / n;
  return Tensor::from_vector<float>(DType::Float32, s[0].shape(), acc);
}

Tensor two_sub_params(const std::string& name, const std::vector<Tensor>& s) {
  check_cat(name, s, 0);
  std::vector<Tensor> first, second;
  for (const auto& t : s) {
    const int64_t n = t.shape()[0], h = (n + 1) / 2;  // torch.chunk(2): first part rounds up
    first.push_back(t.narrow(0, 0, h));
    second.push_back(t.narrow(0, h, n - h));
  }
  return cat({cat(first, 0), cat(second, 0)}, 0);
}

Tensor sub_params(const std::string& name, const std::vector<Tensor>& s, const patterns::SubParamSpec& spec) {
  const int64_t tp = static_cast<int64_t>(s.size()), pd = spec.partition_dim;
  int64_t total = 0;
  for (const auto& t : s) total += t.numel();
  std::vector<int64_t> sizes = spec.sub_sizes;
  // Full shape with -1 resolved from the element count.
  std::vector<int64_t> full = spec.shape;
  if (!spec.sizes_as_tuple) {
    // A count of equal sub-params: their size comes from the slices.
    int64_t whole = 0;
    for (const auto& t : s) {
      if (t.dim() <= pd) mismatch(name, "sub-param slices have no dim " + std::to_string(pd));
      whole += t.shape()[pd];
    }
    for (auto& x : sizes) x = whole / static_cast<int64_t>(sizes.size());
    full[pd] = whole;
  }
  int64_t known = 1, unknown = -1;
  for (size_t d = 0; d < full.size(); ++d) {
    if (full[d] < 0) {
      if (unknown >= 0) mismatch(name, "sub-param shape has two -1 dims");
      unknown = static_cast<int64_t>(d);
    } else {
      known *= full[d];
    }
  }
  if (unknown >= 0) {
    if (known == 0 || total % known) mismatch(name, "sub-param shape does not fit " + std::to_string(total) + " elements");
    full[unknown] = total / known;
  }
  for (auto x : sizes)
    if (x % tp) mismatch(name, "sub-param size " + std::to_string(x) + " does not divide by tp=" + std::to_string(tp));
  std::vector<int64_t> part_shape = full;
  part_shape[pd] = full[pd] / tp;
  std::vector<Tensor> views;
  for (size_t i = 0; i < s.size(); ++i) {
    const int64_t n = numel_of(part_shape);
    if (s[i].numel() != n)
      mismatch(name, "shape mismatch between fragments: tp rank " + std::to_string(i) + " slice " +
                         shape_str(s[i].shape()) + " does not fit sub-param partition " + shape_str(part_shape));
    views.push_back(s[i].contiguous().reshape(part_shape));
  }
  std::vector<Tensor> merged;
  int64_t off = 0;
  for (auto size : sizes) {
    std::vector<Tensor> pieces;
    for (const auto& v : views) pieces.push_back(v.narrow(pd, off, size / tp));
    merged.push_back(cat(pieces, pd));
    off += size / tp;
  }
  return cat(merged, pd);
}

}  // namespace

Tensor union_fragments(const std::string& name, const std::vector<Tensor>& slices, const patterns::ParamRule& rule,
                       const patterns::PatternSet& set, const UnionOptions& options) {
  if (slices.empty()) mismatch(name, "no slices");
  switch (rule.kind) {
    case JoinKind::Replicate: return replicate(name, slices, options);
    case JoinKind::Average: return average(name, slices);
    case JoinKind::TwoSubParams: return two_sub_params(name, slices);
    case JoinKind::SubParams: return sub_params(name, slices, set.sub_params.at(rule.sub_param_index));
    case JoinKind::Cat:
      if (slices.size() == 1) return slices[0];
      check_cat(name, slices, rule.cat_dim);
      return cat(slices, rule.cat_dim);
  }
  return slices[0];
}

Tensor strip_padding(const std::string& name, const Tensor& t, int64_t original_vocab_size) {
  if (t.dim() < 1) mismatch(name, "vocabulary parameter is a scalar");
  if (original_vocab_size > t.shape()[0])
    mismatch(name, "original_vocab_size " + std::to_string(original_vocab_size) + " exceeds its " +
                       std::to_string(t.shape()[0]) + " rows");
  if (original_vocab_size == t.shape()[0]) return t;
  return t.narrow(0, 0, original_vocab_size).contiguous(true);
}

}  // namespace ucpkit::to_universal
