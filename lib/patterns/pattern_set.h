// Pattern sets: which regexes say how a parameter's tensor-parallel fragments are joined
// (formats.md section 4), read from `universal_checkpoint_info` or from a patterns/*.json file.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "patterns/linear_regex.h"

namespace ucpkit::patterns {

enum class Category : uint8_t {
  Vocabulary,           // vocabulary_parameter_patterns: strip padded rows, mark vocab_tensor
  PipelineReplicated,   // pipeline_replicated_parameter_patterns: take pipeline stage 0 only
  TpReplicated,         // tp_replicated_parameter_patterns: all TP copies equal, keep one
  Average,              // parameter_to_average_patterns: mean of TP copies ("Partial")
  RowParallel,          // parameter_with_row_parallelism_patterns: cat_dim 1
  TwoSubParamsCatDim0,  // parameter_with_2_sub_params_cat_dim_0: fused SwiGLU h_to_4h
  kCount
};
constexpr int kCategoryCount = static_cast<int>(Category::kCount);
// The key of a category in universal_checkpoint_info.
const char* category_key(Category c);

// One entry of parameter_with_sub_params (DeepSpeed's SubparamShape): along `partition_dim` the
// tensor is the concatenation of sub-parameters of `sub_sizes` (e.g. Q, K, V with GQA), each split
// across TP on its own; other dims are given by `shape` (-1 = inferred).
struct SubParamSpec {
  std::vector<std::string> patterns;
  std::vector<int64_t> shape;       // entry at partition_dim unused (sum of sub_sizes)
  std::vector<int64_t> sub_sizes;   // sizes along partition_dim
  bool sizes_as_tuple = true;       // DeepSpeed wrote a tuple (else a count of equal sub-params)
  int64_t partition_dim = 0;
};

// A compiled regex with Python re.match semantics (anchored at the start only), matched in linear
// time (patterns/linear_regex): a pattern from a checkpoint's metadata cannot hang a tool.
class Pattern {
 public:
  explicit Pattern(std::string source);
  bool matches(const std::string& name) const;
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  LinearRegex regex_;
};

struct PatternSet {
  double version = 0;
  std::optional<int64_t> original_vocab_size, padded_vocab_size;
  std::vector<Pattern> lists[kCategoryCount];
  std::vector<SubParamSpec> sub_params;
  std::vector<std::vector<Pattern>> sub_param_patterns;  // compiled, parallel to sub_params
  std::string origin;  // "checkpoint", a file path, or "none"

  // From the JSON form of universal_checkpoint_info (a pattern file has the same keys).
  // Errors (Error) name `origin`, escaped: a bad regex, a value of the wrong type, a size-like number
  // that is not whole or beyond 2^40.
  static PatternSet from_json(const nlohmann::json& info, std::string origin);
  nlohmann::json to_json() const;
  // Every pattern source, for the unused-pattern check.
  std::vector<std::string> all_sources() const;
  // all_sources() minus `used` (the sources that matched a parameter), in all_sources() order.
  std::vector<std::string> unused_sources(const std::set<std::string>& used) const;
  bool empty() const;

 private:
  static PatternSet from_json_unchecked(const nlohmann::json& info, std::string origin);
};

// How the fragments of one parameter are joined (the rule order of ds_to_universal).
enum class JoinKind : uint8_t { Replicate, Average, TwoSubParams, SubParams, Cat };

struct ParamRule {
  JoinKind kind = JoinKind::Cat;
  int64_t cat_dim = 0;             // Cat; TwoSubParams uses 0
  int sub_param_index = -1;        // SubParams: index into PatternSet::sub_params
  bool vocab = false;
  bool pipeline_replicated = false;
  std::vector<std::string> matched;  // pattern sources that matched (for the unused check)
};

// Classifies `name`; throws Error when two patterns of one category match it.
ParamRule classify(const PatternSet& set, const std::string& name);
const char* join_kind_name(JoinKind k);
std::string describe(const ParamRule& rule);  // "cat_dim=1", "replicate", "sub_params", ...

}  // namespace ucpkit::patterns
