// DeepSpeed's PipelineModule partition methods (partition.h).
#include "formats/deepspeed/partition.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "formats/deepspeed/file_names.h"
#include "io/pickle/value.h"
#include "io/torch/torch_file.h"

namespace fs = std::filesystem;

namespace ucpkit::formats::deepspeed {

namespace {
constexpr const char* kTypePrefix = "type:";
constexpr const char* kOption = "--partition-method";
}  // namespace

PartitionMethod parse_partition_method(const std::string& text) {
  std::string lower = text;
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  PartitionMethod m;
  if (lower == "parameters") return m;
  if (lower == "uniform") {
    m.kind = PartitionMethod::Kind::Uniform;
    return m;
  }
  if (lower.rfind(kTypePrefix, 0) == 0) {
    m.kind = PartitionMethod::Kind::Type;
    // method.split(':')[1] (module.py v0.19.6 :413): the text up to a second ':'.
    const std::string rest = lower.substr(std::string(kTypePrefix).size());
    m.type_regex = rest.substr(0, rest.find(':'));
    return m;
  }
  throw UsageError(std::string(kOption) + " " + escaped_brief(text, 60) +
                   ": DeepSpeed's partition methods are parameters, uniform and type:<regex> (profile is not implemented "
                   "by DeepSpeed either)");
}

std::string to_string(const PartitionMethod& m) {
  switch (m.kind) {
    case PartitionMethod::Kind::Uniform: return "uniform";
    case PartitionMethod::Kind::Type: return kTypePrefix + m.type_regex;
    case PartitionMethod::Kind::Parameters: break;
  }
  return "parameters";
}

std::vector<int64_t> partition_uniform(int64_t num_items, int num_parts) {
  std::vector<int64_t> parts(static_cast<size_t>(num_parts) + 1, 0);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min<int64_t>(p, num_items);
    return parts;
  }
  const int64_t chunk = num_items / num_parts, residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk;
  for (int64_t i = 0; i < residual; ++i)
    for (int p = static_cast<int>(i) + 1; p <= num_parts; ++p) parts[p] += 1;
  return parts;
}

std::vector<int64_t> partition_balanced(const std::vector<int64_t>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size()), m = num_parts;
  if (n <= m) return partition_uniform(n, m);
  constexpr double inf = std::numeric_limits<double>::infinity();
  const size_t cols = static_cast<size_t>(m) + 1;
  std::vector<double> dp_max((n + 1) * cols, inf), dp_min((n + 1) * cols, inf), dp_cost((n + 1) * cols, inf);
  std::vector<int64_t> position((n + 1) * cols, 0);
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + static_cast<double>(weights[i]);  // np.cumsum, float64
  auto at = [cols](int i, int j) { return static_cast<size_t>(i) * cols + static_cast<size_t>(j); };
  dp_max[at(0, 0)] = 0;
  dp_cost[at(0, 0)] = 0;  // dp_min[0, 0] stays inf, as in DeepSpeed
  for (int i = 1; i <= n; ++i)
    for (int j = 1; j <= std::min(i, m); ++j)
      for (int k = 0; k < i; ++k) {
        const double part = prefix[i] - prefix[k];
        const double max_sum = std::max(dp_max[at(k, j - 1)], part), min_sum = std::min(dp_min[at(k, j - 1)], part);
        const double cost = max_sum - min_sum;  // inf - inf is nan: never <= dp_cost, as numpy's comparison
        if (dp_cost[at(i, j)] >= cost) {
          dp_cost[at(i, j)] = cost;
          dp_max[at(i, j)] = max_sum;
          dp_min[at(i, j)] = min_sum;
          position[at(i, j)] = k;
        }
      }
  std::vector<int64_t> parts{n};
  for (int i = m; i >= 1; --i) parts.push_back(position[at(static_cast<int>(parts.back()), i)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> read_layer_types(const std::string& path) {
  std::istringstream in(read_text_file(path, "layer types file (--layer-types)"));
  std::vector<std::string> names;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
    size_t b = 0;
    while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
    line.erase(0, b);
    if (line.empty())
      throw Error(path + ":" + std::to_string(n) + ": empty line; --layer-types names one layer class per line "
                  "(every entry of the PipelineModule's layer list, in order)");
    names.push_back(line);
  }
  if (in.bad()) throw Error(path + ": cannot read the layer types file (--layer-types)");
  if (names.empty()) throw Error(path + ": no layer class names (--layer-types: one per line)");
  return names;
}

std::vector<int64_t> partition_layers(const PartitionMethod& method, const std::vector<PipelineLayer>& layers, int stages) {
  if (stages < 1) throw UsageError("--pp " + std::to_string(stages) + ": at least 1 pipeline stage");
  switch (method.kind) {
    case PartitionMethod::Kind::Uniform: return partition_uniform(static_cast<int64_t>(layers.size()), stages);
    case PartitionMethod::Kind::Parameters: {
      std::vector<int64_t> counts;
      for (const auto& l : layers) counts.push_back(l.params);
      return partition_balanced(counts, stages);
    }
    case PartitionMethod::Kind::Type: break;
  }
  std::regex re;
  try {
    re = std::regex(method.type_regex, std::regex::ECMAScript | std::regex::icase);
  } catch (const std::regex_error&) {
    throw UsageError(std::string(kOption) + " type:" + escaped_brief(method.type_regex, 60) + ": not a regular expression");
  }
  std::vector<int64_t> binary(layers.size(), 0);
  bool any = false;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i].type_name)
      throw Error(std::string(kOption) + " type:" + method.type_regex + ": layer " + std::to_string(i) +
                  "'s class name is not known (a checkpoint's layer files hold state dicts, not classes); give "
                  "--layer-types FILE, the PipelineModule's layer class names in order, one per line, or use "
                  "--partition-method parameters or uniform");
    if (std::regex_search(*layers[i].type_name, re)) binary[i] = 1, any = true;
  }
  if (!any) throw Error("Partitioning '" + method.type_regex + "' found no valid layers to partition.");
  return partition_balanced(binary, stages);
}

std::map<int, int64_t> layer_file_params(const std::string& step_dir, int tp,
                                         const std::function<bool(int, const std::string&)>& is_param) {
  std::map<int, int64_t> out;
  for (const auto& e : fs::directory_iterator(step_dir)) {
    if (!e.is_regular_file()) continue;
    const auto name = parse_file_name(e.path().filename().string());
    if (!name || name->kind != FileKind::LayerStates || std::max(name->tp, 0) != tp) continue;
    const std::string path = e.path().string();
    auto root = load_torch(path);
    if (!root || root->kind != pickle::Kind::Dict) fail(path, "not a layer state dict");
    int64_t& n = out[name->layer];
    for (const auto& [k, v] : root->entries) {
      if (!k || k->kind != pickle::Kind::Str) fail(path, "a key that is not a string");
      if (!v || v->kind != pickle::Kind::Tensor || !v->tensor) continue;
      if (is_param(name->layer, k->s)) n += v->tensor->numel();
    }
  }
  return out;
}

}  // namespace ucpkit::formats::deepspeed
