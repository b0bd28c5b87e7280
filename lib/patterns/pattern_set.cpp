// Pattern sets: parsing, Python re.match matching and the join-rule order of ds_to_universal.
#include "patterns/pattern_set.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ucpkit::patterns {

namespace {
const char* const kKeys[kCategoryCount] = {
    "vocabulary_parameter_patterns",        "pipeline_replicated_parameter_patterns",
    "tp_replicated_parameter_patterns",     "parameter_to_average_patterns",
    "parameter_with_row_parallelism_patterns", "parameter_with_2_sub_params_cat_dim_0",
};
constexpr const char* kSubParamsKey = "parameter_with_sub_params";
}  // namespace

const char* category_key(Category c) { return kKeys[static_cast<int>(c)]; }

Pattern::Pattern(std::string source) : source_(std::move(source)), regex_(source_) {}

bool Pattern::matches(const std::string& name) const { return regex_.match_prefix(name); }

namespace {
// A size-like number of a patterns file: whole, in [0, 2^40] (a vocabulary, a sub-parameter count or
// dimension); anything else is refused naming the file (a count of 1e15 sub-parameters allocated 8 PB).
int64_t bounded_int(const nlohmann::json& v, const std::string& origin, const std::string& what) {
  constexpr double kMax = 1099511627776.0;  // 2^40
  if (!v.is_number() || !(v.get<double>() >= 0) || v.get<double>() > kMax || v.get<double>() != std::floor(v.get<double>()))
    throw Error(origin + ": " + what + " " + escaped_brief(v.dump(), 40) + " is not a whole number in [0, 2^40]");
  return v.get<int64_t>();
}
}  // namespace

// Every error names the patterns' origin (the file, or "checkpoint"), escaped and cut: a pattern, a
// number or a value of the wrong type from the file is shown at most 80 characters long.
PatternSet PatternSet::from_json(const nlohmann::json& info, std::string origin) {
  const std::string shown = escaped_brief(origin, 200);
  try {
    return from_json_unchecked(info, std::move(origin));
  } catch (const nlohmann::json::exception& e) {
    throw Error(shown + ": malformed patterns (" + escaped_brief(e.what(), 120) + ")");
  } catch (const PatternError& e) {
    throw Error(shown + ": " + e.what());
  }
}

PatternSet PatternSet::from_json_unchecked(const nlohmann::json& info, std::string origin) {
  PatternSet set;
  set.origin = std::move(origin);
  const std::string shown = escaped_brief(set.origin, 200);
  if (!info.is_object()) throw Error(shown + ": patterns must be a JSON object");
  auto get_int = [&](const char* key) -> std::optional<int64_t> {
    if (info.contains(key) && info[key].is_number()) return bounded_int(info[key], shown, key);
    return std::nullopt;
  };
  set.original_vocab_size = get_int("original_vocab_size");
  set.padded_vocab_size = get_int("padded_vocab_size");
  if (info.contains("universal_checkpoint_version") && info["universal_checkpoint_version"].is_number())
    set.version = info["universal_checkpoint_version"].get<double>();
  for (int c = 0; c < kCategoryCount; ++c) {
    if (!info.contains(kKeys[c]) || info[kKeys[c]].is_null()) continue;
    const auto& list = info[kKeys[c]];
    if (!list.is_array()) throw Error(shown + ": " + kKeys[c] + " must be a list of regexes");
    for (const auto& p : list) {
      if (!p.is_string()) throw Error(shown + ": " + kKeys[c] + " holds a non-string");
      set.lists[c].emplace_back(p.get<std::string>());
    }
  }
  if (info.contains(kSubParamsKey) && info[kSubParamsKey].is_array()) {
    for (const auto& s : info[kSubParamsKey]) {
      SubParamSpec spec;
      if (!s.is_object() || !s.contains("patterns") || !s.contains("shape"))
        throw Error(shown + ": parameter_with_sub_params entries need patterns, shape, partition_dim");
      spec.partition_dim = s.value("partition_dim", 0);
      for (const auto& p : s["patterns"]) spec.patterns.push_back(p.get<std::string>());
      const auto& shape = s["shape"];
      if (!shape.is_array() || spec.partition_dim < 0 || spec.partition_dim >= (int64_t)shape.size())
        throw Error(shown + ": bad sub-param shape " + escaped_brief(shape.dump(), 80));
      for (size_t d = 0; d < shape.size(); ++d) {
        if ((int64_t)d == spec.partition_dim) {
          if (shape[d].is_array()) {
            int64_t sum = 0;
            for (const auto& x : shape[d]) {
              spec.sub_sizes.push_back(bounded_int(x, shown, "sub-param size"));
              sum += spec.sub_sizes.back();
            }
            spec.shape.push_back(sum);
          } else {
            spec.sizes_as_tuple = false;  // a count of equal sub-params
            const int64_t count = bounded_int(shape[d], shown, "sub-param count");
            if (count > 4096) throw Error(shown + ": sub-param count " + std::to_string(count) + " is more than 4096");
            spec.sub_sizes.assign(static_cast<size_t>(count), -1);
            spec.shape.push_back(-1);
          }
        } else {
          // -1: a dimension the pattern does not fix (ds_to_universal's convention)
          const bool any = shape[d].is_number_integer() && shape[d].get<int64_t>() == -1;
          spec.shape.push_back(any ? -1 : bounded_int(shape[d], shown, "sub-param dimension"));
        }
      }
      std::vector<Pattern> compiled;
      for (const auto& p : spec.patterns) compiled.emplace_back(p);
      set.sub_param_patterns.push_back(std::move(compiled));
      set.sub_params.push_back(std::move(spec));
    }
  }
  return set;
}

nlohmann::json PatternSet::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  j["universal_checkpoint_version"] = version;
  if (original_vocab_size) j["original_vocab_size"] = *original_vocab_size;
  if (padded_vocab_size) j["padded_vocab_size"] = *padded_vocab_size;
  for (int c = 0; c < kCategoryCount; ++c) {
    auto& list = j[kKeys[c]] = nlohmann::json::array();
    for (const auto& p : lists[c]) list.push_back(p.source());
  }
  auto& subs = j[kSubParamsKey] = nlohmann::json::array();
  for (const auto& s : sub_params) {
    nlohmann::json shape = nlohmann::json::array();
    for (size_t d = 0; d < s.shape.size(); ++d) {
      if ((int64_t)d == s.partition_dim)
        shape.push_back(s.sizes_as_tuple ? nlohmann::json(s.sub_sizes) : nlohmann::json(s.sub_sizes.size()));
      else
        shape.push_back(s.shape[d]);
    }
    subs.push_back({{"patterns", s.patterns}, {"shape", shape}, {"partition_dim", s.partition_dim}});
  }
  return j;
}

std::vector<std::string> PatternSet::all_sources() const {
  // Pipeline-replicated patterns are left out, as in ds_to_universal: Megatron-DeepSpeed publishes
  // them for models that may run without pipeline parallelism.
  std::vector<std::string> out;
  for (int c = 0; c < kCategoryCount; ++c)
    if (c != static_cast<int>(Category::PipelineReplicated))
      for (const auto& p : lists[c]) out.push_back(p.source());
  for (const auto& s : sub_params) out.insert(out.end(), s.patterns.begin(), s.patterns.end());
  return out;
}

std::vector<std::string> PatternSet::unused_sources(const std::set<std::string>& used) const {
  std::vector<std::string> out;
  for (const auto& s : all_sources())
    if (!used.count(s)) out.push_back(s);
  return out;
}

bool PatternSet::empty() const {
  for (const auto& list : lists)
    if (!list.empty()) return false;
  return sub_params.empty();
}

namespace {
const Pattern* match_one(const PatternSet& set, Category c, const std::string& name) {
  const Pattern* found = nullptr;
  for (const auto& p : set.lists[static_cast<int>(c)]) {
    if (!p.matches(name)) continue;
    if (found)
      throw Error("parameter " + name + " matches two " + category_key(c) + ": '" + found->source() + "' and '" +
                  p.source() + "'");
    found = &p;
  }
  return found;
}
}  // namespace

ParamRule classify(const PatternSet& set, const std::string& name) {
  ParamRule rule;
  // Every category is consulted (not only the first that decides) so that a pattern used by any
  // parameter counts as used, as in the strict mode of ds_to_universal.
  const Pattern* hit[kCategoryCount];
  for (int c = 0; c < kCategoryCount; ++c) {
    hit[c] = match_one(set, static_cast<Category>(c), name);
    if (hit[c]) rule.matched.push_back(hit[c]->source());
  }
  for (size_t i = 0; i < set.sub_params.size() && rule.sub_param_index < 0; ++i)
    for (const auto& p : set.sub_param_patterns[i])
      if (p.matches(name)) {
        rule.sub_param_index = static_cast<int>(i);
        rule.matched.push_back(p.source());
        break;
      }
  rule.vocab = hit[static_cast<int>(Category::Vocabulary)] != nullptr;
  rule.pipeline_replicated = hit[static_cast<int>(Category::PipelineReplicated)] != nullptr;
  if (hit[static_cast<int>(Category::TpReplicated)]) {
    rule.kind = JoinKind::Replicate;
  } else if (hit[static_cast<int>(Category::Average)]) {
    rule.kind = JoinKind::Average;
  } else if (hit[static_cast<int>(Category::TwoSubParamsCatDim0)]) {
    rule.kind = JoinKind::TwoSubParams;
    rule.cat_dim = 0;
  } else if (rule.sub_param_index >= 0) {
    rule.kind = JoinKind::SubParams;
  } else {
    rule.kind = JoinKind::Cat;
    rule.cat_dim = hit[static_cast<int>(Category::RowParallel)] ? 1 : 0;
  }
  return rule;
}

const char* join_kind_name(JoinKind k) {
  switch (k) {
    case JoinKind::Replicate: return "replicate";
    case JoinKind::Average: return "average";
    case JoinKind::TwoSubParams: return "two_sub_params";
    case JoinKind::SubParams: return "sub_params";
    case JoinKind::Cat: return "cat";
  }
  return "?";
}

std::string describe(const ParamRule& rule) {
  std::string s = join_kind_name(rule.kind);
  if (rule.kind == JoinKind::Cat) s += "_dim" + std::to_string(rule.cat_dim);
  if (rule.vocab) s += "+vocab";
  if (rule.pipeline_replicated) s += "+pipeline_replicated";
  return s;
}

}  // namespace ucpkit::patterns
