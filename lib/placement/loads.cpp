// Load readers: JSON matrices and dumps, CSV, Megatron router traces; optional moving average.
#include "placement/loads.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"
#include "io/router_trace.h"
#include "placement/engine_formats.h"

namespace ucpkit::placement {
namespace {

using json = nlohmann::json;
using Snapshot = std::vector<std::vector<double>>;

constexpr double kMaxLoad = 9007199254740992.0;  // 2^53

double number(const json& v, const std::string& name, size_t l, size_t e) {
  if (v.is_number()) return v.get<double>();
  if (v.is_null()) return std::nan("");  // NaN serialized by Python's json as null in some dumps
  fail(name, "layer " + std::to_string(l) + " expert " + std::to_string(e) + ": not a number: " + json_brief(v));
}

Snapshot matrix_from_json(const json& m, const std::string& name) {
  if (!m.is_array() || m.empty()) fail(name, "loads must be a non-empty [layers][experts] matrix");
  Snapshot out;
  for (size_t l = 0; l < m.size(); ++l) {
    if (!m[l].is_array()) fail(name, "layer " + std::to_string(l) + " is not a list of expert loads");
    std::vector<double> row;
    for (size_t e = 0; e < m[l].size(); ++e) row.push_back(number(m[l][e], name, l, e));
    out.push_back(std::move(row));
  }
  return out;
}

bool is_3d(const json& m) {
  return m.is_array() && !m.empty() && m[0].is_array() && !m[0].empty() && m[0][0].is_array();
}

std::vector<Snapshot> snapshots_from_array(const json& m, const std::string& name) {
  std::vector<Snapshot> out;
  if (is_3d(m)) {
    for (const auto& s : m) out.push_back(matrix_from_json(s, name));
  } else {
    out.push_back(matrix_from_json(m, name));
  }
  return out;
}

// An engine's logical_count [buffer][layers][experts] is one record of counts per forward pass, not
// a series of snapshots: summed over the buffer, as its .pt dump is (engine_formats.h; SGLang sums the
// same axis before rebalancing), so --window and --snapshot do not apply.
Snapshot summed_buffer(const std::vector<Snapshot>& buffer, const std::string& name, const std::string& key) {
  Snapshot sum = buffer.front();
  for (size_t b = 1; b < buffer.size(); ++b) {
    if (buffer[b].size() != sum.size())
      fail(name, "\"" + key + "\" entry " + std::to_string(b) + " has " + std::to_string(buffer[b].size()) +
                     " layers, entry 0 has " + std::to_string(sum.size()));
    for (size_t l = 0; l < sum.size(); ++l) {
      if (buffer[b][l].size() != sum[l].size())
        fail(name, "\"" + key + "\" entry " + std::to_string(b) + " layer " + std::to_string(l) + " has " +
                       std::to_string(buffer[b][l].size()) + " experts, entry 0 has " + std::to_string(sum[l].size()));
      for (size_t e = 0; e < sum[l].size(); ++e) sum[l][e] += buffer[b][l][e];
    }
  }
  return sum;
}

std::vector<Snapshot> snapshots_from_json(const json& doc, const std::string& name, const LoadFileOptions& opt) {
  if (doc.is_array()) return snapshots_from_array(doc, name);
  if (!doc.is_object()) fail(name, "expected a JSON matrix or object with expert loads");
  if (doc.contains("iterations")) {
    const json& it = doc["iterations"];
    if (!it.is_object() || it.empty()) fail(name, "\"iterations\" must map snapshot keys to matrices");
    std::vector<std::pair<std::string, const json*>> keys;
    for (auto kv = it.begin(); kv != it.end(); ++kv) keys.emplace_back(kv.key(), &kv.value());
    auto numeric = [](const std::string& k) {
      try {
        return std::stod(k);
      } catch (...) {
        return 0.0;
      }
    };
    std::stable_sort(keys.begin(), keys.end(),
                     [&](const auto& a, const auto& b) { return numeric(a.first) < numeric(b.first); });
    std::vector<Snapshot> out;
    if (!opt.snapshot.empty()) {
      for (const auto& [k, v] : keys)
        if (k == opt.snapshot) return {matrix_from_json(*v, name)};
      fail(name, "no snapshot \"" + opt.snapshot + "\" in \"iterations\"");
    }
    for (const auto& [k, v] : keys) out.push_back(matrix_from_json(*v, name));
    return out;
  }
  for (const char* key : {"weight", "loads", "expert_loads"}) {
    if (doc.contains(key)) return snapshots_from_array(doc[key], name);
  }
  for (const char* key : {"logical_count", "logical_counts"})
    if (doc.contains(key)) return {summed_buffer(snapshots_from_array(doc[key], name), name, key)};
  fail(name, "no expert loads found (expected \"weight\", \"loads\", \"logical_count\" or \"iterations\")");
}

std::vector<Snapshot> snapshots_from_csv(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  Snapshot m;
  bool first = true, drop_first_column = false;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos || line[0] == '#') continue;
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream ls(line);
    while (std::getline(ls, cell, ',')) cells.push_back(cell);
    auto trim = [](std::string s) {
      s.erase(0, s.find_first_not_of(" \t\""));
      s.erase(s.find_last_not_of(" \t\"") + 1);
      return s;
    };
    for (auto& c : cells) c = trim(c);
    if (first) {
      first = false;
      char* end = nullptr;
      std::strtod(cells.empty() ? "" : cells[0].c_str(), &end);
      bool header = cells.empty() || end == cells[0].c_str() || *end != '\0';
      if (header) {
        std::string h = cells.empty() ? "" : cells[0];
        std::transform(h.begin(), h.end(), h.begin(), ::tolower);
        drop_first_column = (h == "layer" || h == "layers");
        continue;
      }
    }
    std::vector<double> row;
    for (size_t i = drop_first_column ? 1 : 0; i < cells.size(); ++i) {
      char* end = nullptr;
      double v = std::strtod(cells[i].c_str(), &end);
      if (cells[i].empty() || *end != '\0')
        fail(name, "line " + std::to_string(lineno) + ": not a number: \"" + cells[i] + "\"");
      row.push_back(v);
    }
    m.push_back(std::move(row));
  }
  if (m.empty()) fail(name, "no rows of expert loads");
  return {m};
}

std::vector<Snapshot> snapshots_from_trace(const std::string& text, const std::string& name,
                                           const LoadFileOptions& opt) {
  const io::RouterTrace trace = io::parse_router_trace(text, name);
  if (trace.iterations.empty()) fail(name, "no router trace records");
  const size_t experts = opt.experts ? opt.experts : trace.experts;
  if (experts < trace.experts)
    fail(name, "expert id " + std::to_string(trace.experts - 1) + " out of range for " + std::to_string(experts) +
                   " experts");
  std::vector<Snapshot> out;
  for (const auto& [iteration, m] : trace.iterations) {
    if (!opt.snapshot.empty() && std::to_string(iteration) != opt.snapshot) continue;
    Snapshot s(trace.layers, std::vector<double>(experts, 0.0));
    for (size_t l = 0; l < m.size(); ++l)
      for (size_t e = 0; e < m[l].size(); ++e) s[l][e] = static_cast<double>(m[l][e]);
    out.push_back(std::move(s));
  }
  if (out.empty()) fail(name, "no records of iteration " + opt.snapshot);
  return out;
}

LoadMatrix average(const std::vector<Snapshot>& snaps, const std::string& name, size_t window) {
  size_t n = snaps.size();
  size_t take = (window == 0 || window > n) ? n : window;
  const Snapshot& ref = snaps[n - take];
  LoadMatrix out;
  out.layers = ref.size();
  out.experts = ref.empty() ? 0 : ref[0].size();
  out.values.assign(out.layers * out.experts, 0.0);
  for (size_t s = n - take; s < n; ++s) {
    const Snapshot& m = snaps[s];
    if (m.size() != out.layers) fail(name, "snapshots disagree on the number of layers");
    for (size_t l = 0; l < m.size(); ++l) {
      if (m[l].size() != out.experts)
        fail(name, "layer " + std::to_string(l) + " has " + std::to_string(m[l].size()) + " experts, layer 0 has " +
                       std::to_string(out.experts) + " (loads must be [layers][experts])");
      for (size_t e = 0; e < out.experts; ++e) out.values[l * out.experts + e] += m[l][e] / static_cast<double>(take);
    }
  }
  return out;
}

}  // namespace

void validate_loads(const LoadMatrix& loads, const std::string& name) {
  if (loads.layers == 0 || loads.experts == 0) fail(name, "loads are empty");
  if (loads.values.size() != loads.layers * loads.experts) fail(name, "loads are not a [layers][experts] matrix");
  for (size_t l = 0; l < loads.layers; ++l)
    for (size_t e = 0; e < loads.experts; ++e) {
      double v = loads.at(l, e);
      if (!std::isfinite(v))
        fail(name, "layer " + std::to_string(l) + " expert " + std::to_string(e) + ": load is not a finite number");
      if (v < 0)
        fail(name,
             "layer " + std::to_string(l) + " expert " + std::to_string(e) + ": negative load " + std::to_string(v));
      // Token counts above 2^53 are not exact in a double, and sums of 1e300s overflow to inf
      // (balancedness inf, recovery computed on NaN shares).
      if (v > kMaxLoad)
        fail(name, "layer " + std::to_string(l) + " expert " + std::to_string(e) + ": load " + json_brief(json(v)) +
                       " out of range (at most 2^53)");
    }
}

LoadMatrix parse_loads(const std::string& text, const std::string& name, const LoadFileOptions& opt) {
  std::vector<Snapshot> snaps;
  size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) fail(name, "file is empty");
  if (name.ends_with(".csv")) {
    snaps = snapshots_from_csv(text, name);
  } else if (name.ends_with(".jsonl") || name.ends_with(".ndjson")) {
    snaps = snapshots_from_trace(text, name, opt);
  } else if (text[start] == '[' || text[start] == '{') {
    json doc;
    const bool parsed = text[start] == '{' ? try_parse_json_input(text, name, doc) : true;
    if (text[start] != '{') doc = parse_json_input(text, name);
    snaps = parsed ? snapshots_from_json(doc, name, opt) : snapshots_from_trace(text, name, opt);
  } else {
    snaps = snapshots_from_csv(text, name);
  }
  if (snaps.empty()) fail(name, "no expert loads");
  LoadMatrix out = average(snaps, name, opt.window);
  validate_loads(out, name);
  return out;
}

LoadMatrix read_loads(const std::string& path, const LoadFileOptions& options) {
  if (path.ends_with(".pt") || path.ends_with(".safetensors")) return read_engine_loads(path);
  return parse_loads(read_text_file(path), path, options);
}

}  // namespace ucpkit::placement
