// The join table: for each JoinKind its join, its split, the dimension it splits and its state-file keys.
#include "formats/universal/join.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "io/shape.h"

namespace ucpkit::formats::universal {

using patterns::JoinKind;

namespace {

// What a row's functions know of the parameter.
struct Param {
  const std::string& name;
  const patterns::ParamRule& rule;
  const patterns::PatternSet& set;
  const patterns::SubParamSpec& spec() const { return set.sub_params.at(rule.sub_param_index); }
};

[[noreturn]] void mismatch(const std::string& name, const std::string& what) {
  throw Error("parameter " + name + ": " + what);
}

[[noreturn]] void indivisible(const std::string& name, const std::vector<int64_t>& shape, int dim, int64_t size,
                              int tp, const char* what) {
  throw Error("impossible layout: tp=" + std::to_string(tp) + " does not divide " + what + " " +
              std::to_string(size) + " (dim " + std::to_string(dim) + " of " + name + ", shape " + shape_str(shape) +
              ")");
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

// Every rank holds the whole tensor (Replicate, Average): one piece, not cut.
void split_whole(const Param&, const std::vector<int64_t>& full, int, int, Split& s) { s.pieces = {{0, full[0]}}; }
int no_split_dim(const Param&) { return -1; }
void no_keys(const Param&, StateFile&) {}

// --- Replicate (tp_replicated_parameter_patterns): the copies must agree; keep rank 0's.
Tensor join_replicate(const Param& p, const std::vector<Tensor>& s, const JoinOptions& o) {
  same_shapes(p.name, s);
  for (size_t i = 1; i < s.size(); ++i) {
    if (s[i].equal(s[0])) continue;
    if (o.tolerance > 0 && s[0].dtype() == DType::Float32 && s[i].dtype() == DType::Float32) {
      auto a = s[0].contiguous(), b = s[i].contiguous();
      const float* pa = reinterpret_cast<const float*>(a.contiguous_bytes().data());
      const float* pb = reinterpret_cast<const float*>(b.contiguous_bytes().data());
      double worst = 0;
      for (int64_t k = 0; k < a.numel(); ++k) worst = std::max(worst, (double)std::fabs(pa[k] - pb[k]));
      if (worst <= o.tolerance) continue;
      mismatch(p.name, "TP-replicated copies differ: tp rank " + std::to_string(i) + " differs from rank 0 by up to " +
                           std::to_string(worst) + " (> --tolerance " + std::to_string(o.tolerance) + ")");
    }
    mismatch(p.name, "TP-replicated copies differ between tp rank 0 and tp rank " + std::to_string(i) +
                         " (use --tolerance to accept drifted replicas)");
  }
  return s[0];
}

// --- Average (parameter_to_average_patterns): the mean of the copies.
Tensor join_average(const Param& p, const std::vector<Tensor>& s, const JoinOptions&) {
  same_shapes(p.name, s);
  if (s[0].dtype() != DType::Float32) mismatch(p.name, "averaging needs float32 slices");
  // Same arithmetic as Python's sum(slices) / len(slices) in float32: sum() starts from the int 0,
  // so the accumulator starts at +0.0 (0 + -0.0 is +0.0), adds left to right, then divides.
  std::vector<float> acc(static_cast<size_t>(s[0].numel()), +0.0f);
  for (size_t i = 0; i < s.size(); ++i)
    for_each_float(s[i].contiguous(), [&](int64_t k, float v) { acc[k] = acc[k] + v; });
  const float n = static_cast<float>(s.size());
  for (auto& v : acc) v = v / n;
  return Tensor::from_vector<float>(DType::Float32, s[0].shape(), acc);
}

// --- TwoSubParams (parameter_with_2_sub_params_cat_dim_0, a fused SwiGLU h_to_4h): each rank holds
// its half of both sub-params along dim 0.
Tensor join_two_sub_params(const Param& p, const std::vector<Tensor>& s, const JoinOptions&) {
  check_cat(p.name, s, 0);
  std::vector<Tensor> first, second;
  for (const auto& t : s) {
    const int64_t n = t.shape()[0], h = (n + 1) / 2;  // torch.chunk(2): first part rounds up
    first.push_back(t.narrow(0, 0, h));
    second.push_back(t.narrow(0, h, n - h));
  }
  return cat({cat(first, 0), cat(second, 0)}, 0);
}

void split_two_sub_params(const Param& p, const std::vector<int64_t>& full, int tp, int t, Split& s) {
  if (full[0] % 2) throw Error("parameter " + p.name + " has an odd dim 0 but two sub-params");
  const int64_t half = full[0] / 2;
  if (half % tp) indivisible(p.name, full, 0, half, tp, "the sub-parameter size");
  const int64_t n = half / tp;
  s.pieces = {{t * n, n}, {half + t * n, n}};
  s.shape[0] = 2 * n;
}

int two_sub_params_dim(const Param&) { return 0; }

void two_sub_params_keys(const Param&, StateFile& f) {
  f.cat_dim = 0;
  f.param_n_sub_params = 2;
}

// --- SubParams (parameter_with_sub_params, e.g. fused QKV with GQA): along partition_dim the tensor
// is the concatenation of sub-params of the spec's sizes, each split across TP on its own.
Tensor join_sub_params(const Param& p, const std::vector<Tensor>& s, const JoinOptions&) {
  const std::string& name = p.name;
  const patterns::SubParamSpec& spec = p.spec();
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

void split_sub_params(const Param& p, const std::vector<int64_t>& full, int tp, int t, Split& s) {
  const auto& spec = p.spec();
  const int d = static_cast<int>(spec.partition_dim);
  if (d >= (int)full.size()) throw Error("parameter " + p.name + " has no partition dim " + std::to_string(d));
  std::vector<int64_t> sizes = spec.sub_sizes;
  if (!spec.sizes_as_tuple) {
    const int64_t k = static_cast<int64_t>(sizes.size());
    if (k <= 0 || full[d] % k) throw Error("parameter " + p.name + " cannot be cut into " + std::to_string(k) + " sub-params");
    std::fill(sizes.begin(), sizes.end(), full[d] / k);
  }
  if (std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != full[d])
    throw Error("parameter " + p.name + ": sub-param sizes do not add up to dim " + std::to_string(d) + " = " +
                std::to_string(full[d]));
  s.dim = d;
  s.shape[d] = 0;
  int64_t base = 0;
  for (int64_t sz : sizes) {
    if (sz % tp) indivisible(p.name, full, d, sz, tp, "the sub-parameter size");
    const int64_t n = sz / tp;
    s.pieces.push_back({base + t * n, n});
    s.shape[d] += n;
    base += sz;
  }
}

int sub_params_dim(const Param& p) { return static_cast<int>(p.spec().partition_dim); }

void sub_params_keys(const Param& p, StateFile& f) { f.sub_param_shape = p.spec(); }

// --- Cat (the default; cat_dim 1 for parameter_with_row_parallelism_patterns): torch.cat along cat_dim.
Tensor join_cat(const Param& p, const std::vector<Tensor>& s, const JoinOptions&) {
  if (s.size() == 1) return s[0];
  check_cat(p.name, s, p.rule.cat_dim);
  return cat(s, p.rule.cat_dim);
}

void split_cat(const Param& p, const std::vector<int64_t>& full, int tp, int t, Split& s) {
  const int d = static_cast<int>(p.rule.cat_dim);
  if (d >= (int)full.size()) throw Error("parameter " + p.name + " has no dim " + std::to_string(d) + " to split");
  if (full[d] % tp) indivisible(p.name, full, d, full[d], tp, "the split dimension");
  const int64_t n = full[d] / tp;
  s.dim = d;
  s.pieces = {{t * n, n}};
  s.shape[d] = n;
}

int cat_dim_of(const Param& p) { return static_cast<int>(p.rule.cat_dim); }

void cat_keys(const Param& p, StateFile& f) { f.cat_dim = p.rule.cat_dim; }

struct Row {
  JoinKind kind;
  Tensor (*join)(const Param&, const std::vector<Tensor>&, const JoinOptions&);
  void (*split)(const Param&, const std::vector<int64_t>& full, int tp, int t, Split&);
  int (*split_dim)(const Param&);
  void (*keys)(const Param&, StateFile&);
};

constexpr Row kRows[] = {
    {JoinKind::Replicate, join_replicate, split_whole, no_split_dim, no_keys},
    {JoinKind::Average, join_average, split_whole, no_split_dim, no_keys},
    {JoinKind::TwoSubParams, join_two_sub_params, split_two_sub_params, two_sub_params_dim, two_sub_params_keys},
    {JoinKind::SubParams, join_sub_params, split_sub_params, sub_params_dim, sub_params_keys},
    {JoinKind::Cat, join_cat, split_cat, cat_dim_of, cat_keys},
};
static_assert(std::size(kRows) == 5 && kRows[0].kind == JoinKind::Replicate && kRows[1].kind == JoinKind::Average &&
                  kRows[2].kind == JoinKind::TwoSubParams && kRows[3].kind == JoinKind::SubParams &&
                  kRows[4].kind == JoinKind::Cat,
              "one row per JoinKind, in enum order");

const Row& row_of(JoinKind k) { return kRows[static_cast<size_t>(k)]; }

}  // namespace

Tensor join(const std::string& name, const std::vector<Tensor>& slices, const patterns::ParamRule& rule,
            const patterns::PatternSet& set, const JoinOptions& options) {
  if (slices.empty()) mismatch(name, "no slices");
  return row_of(rule.kind).join({name, rule, set}, slices, options);
}

Split split(const std::string& name, const std::vector<int64_t>& full, const patterns::ParamRule& rule,
            const patterns::PatternSet& set, int tp, int t) {
  if (full.empty()) throw Error("internal: parameter " + name + " is a scalar; it is not split");
  Split s;
  s.shape = full;
  row_of(rule.kind).split({name, rule, set}, full, tp, t, s);
  return s;
}

int split_dim(const patterns::ParamRule& rule, const patterns::PatternSet& set) {
  static const std::string kNoName;
  return row_of(rule.kind).split_dim({kNoName, rule, set});
}

void record_join(const patterns::ParamRule& rule, const patterns::PatternSet& set, StateFile& file) {
  static const std::string kNoName;
  row_of(rule.kind).keys({kNoName, rule, set}, file);
}

}  // namespace ucpkit::formats::universal
