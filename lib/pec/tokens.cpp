// Token-count readers (JSON matrix, CSV, Megatron router trace JSONL).
#include "pec/tokens.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"
#include "io/router_trace.h"

namespace ucpkit::pec {
namespace {
using nlohmann::json;

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.emplace_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  return out;
}

// Largest count taken: 2^53, the last integer a double (JSON number, CSV cell) holds exactly; sums of
// up to 1024 such counts still fit in int64.
constexpr double kMaxCount = 9007199254740992.0;

// Shortest form of a cell for a message: at most 40 characters, non-printable bytes escaped.
std::string shown(const std::string& s) { return escaped_brief(s, 40); }

int64_t count_of(double v, const std::string& text, const std::string& name) {
  if (!std::isfinite(v) || v < 0 || v > kMaxCount)
    fail(name, "token count " + shown(text) + " is not a number in [0, 2^53]");
  // A count of tokens is whole: 2.5 is another file's statistic (a mean, a share), not rounded into one.
  if (v != std::floor(v)) fail(name, "token count " + shown(text) + " is not a whole number");
  return static_cast<int64_t>(v);
}

int64_t to_count(const std::string& s, const std::string& name) {
  double v = 0;
  try {
    size_t used = 0;
    v = std::stod(s, &used);
    if (used != s.size()) throw std::invalid_argument(s);
  } catch (const std::exception&) {
    fail(name, "not a token count: '" + shown(s) + "'");
  }
  return count_of(v, s, name);
}

int64_t add_count(int64_t a, int64_t b, const std::string& name) {
  int64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) fail(name, "token counts add up beyond the int64 range");
  return sum;
}

void put(TokenMatrix& m, int64_t layer, int64_t expert, int64_t tokens, const std::string& name) {
  if (layer < 0 || expert < 0 || tokens < 0) fail(name, "negative layer, expert or token count");
  if (static_cast<size_t>(layer) >= m.size()) m.resize(static_cast<size_t>(layer) + 1);
  auto& row = m[static_cast<size_t>(layer)];
  if (static_cast<size_t>(expert) >= row.size()) row.resize(static_cast<size_t>(expert) + 1, 0);
  row[static_cast<size_t>(expert)] = add_count(row[static_cast<size_t>(expert)], tokens, name);
}

// `rectangular`: a user's count file, whose rows must all be as long (a short row was read as zeros
// before); matrices a store wrote follow the checkpoint's experts per layer.
TokenMatrix parse_json_matrix(const json& j, const std::string& name, bool rectangular) {
  const json& m = j.is_object() && j.contains("tokens") ? j.at("tokens") : j;
  if (!m.is_array()) fail(name, "expected a JSON matrix [moe_layer][global_expert]");
  TokenMatrix out;
  for (const auto& row : m) {
    if (!row.is_array()) fail(name, "expected a JSON matrix [moe_layer][global_expert]");
    std::vector<int64_t> r;
    for (const auto& v : row) {
      if (!v.is_number()) fail(name, "token counts must be non-negative numbers");
      r.push_back(count_of(v.get<double>(), v.dump(), name));
    }
    if (rectangular && !out.empty() && r.size() != out[0].size())
      fail(name, "ragged matrix: MoE layer " + std::to_string(out.size()) + " has " + std::to_string(r.size()) +
                     " counts, layer 0 has " + std::to_string(out[0].size()));
    out.push_back(std::move(r));
  }
  return out;
}

TokenMatrix parse_jsonl(std::string_view text, const std::string& name) { return io::parse_router_trace(text, name).total(name); }

TokenMatrix parse_csv(std::string_view text, const std::string& name) {
  std::istringstream in{std::string(text)};
  std::string line;
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    if (trim(line).empty() || trim(line).front() == '#') continue;
    rows.push_back(split(line, ','));
  }
  TokenMatrix m;
  if (rows.empty()) return m;
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  int li = -1, ei = -1, ti = -1;
  for (size_t c = 0; c < rows[0].size(); ++c) {
    std::string h = lower(rows[0][c]);
    if (h == "layer" || h == "moe_layer") li = static_cast<int>(c);
    if (h == "expert" || h == "global_expert") ei = static_cast<int>(c);
    if (h == "tokens" || h == "count") ti = static_cast<int>(c);
  }
  if (li >= 0 || ei >= 0 || ti >= 0) {
    if (li < 0 || ei < 0 || ti < 0) fail(name, "CSV header needs layer, expert and tokens columns");
    for (size_t r = 1; r < rows.size(); ++r) {
      const auto& row = rows[r];
      size_t need = static_cast<size_t>(std::max({li, ei, ti}));
      if (row.size() <= need) fail(name, "CSV row " + std::to_string(r + 1) + " has too few columns");
      put(m, to_count(row[li], name), to_count(row[ei], name), to_count(row[ti], name), name);
    }
    return m;
  }
  for (const auto& row : rows) {
    std::vector<int64_t> r;
    for (const auto& cell : row)
      if (!cell.empty()) r.push_back(to_count(cell, name));
    if (!m.empty() && r.size() != m[0].size())
      fail(name, "ragged matrix: MoE layer " + std::to_string(m.size()) + " has " + std::to_string(r.size()) +
                     " counts, layer 0 has " + std::to_string(m[0].size()));
    m.push_back(std::move(r));
  }
  return m;
}
}  // namespace

TokenMatrix parse_tokens(std::string_view text, const std::string& name) {
  std::string_view t = trim(text);
  if (t.empty()) fail(name, "empty token-count file");
  if (t.front() == '[') {
    try {
      return parse_json_matrix(parse_json_input(t, name, "bad JSON"), name, true);
    } catch (const json::exception& e) {
      fail(name, "bad JSON: " + escaped_brief(e.what(), 160));
    }
  }
  if (t.front() == '{') {
    // A single JSON document with a "tokens" key, else one object per line.
    json j;
    if (try_parse_json_input(t, name, j) && j.is_object() && j.contains("tokens")) return parse_json_matrix(j, name, true);
    return parse_jsonl(t, name);
  }
  return parse_csv(t, name);
}

TokenMatrix load_tokens(const std::string& path) { return parse_tokens(read_text_file(path), path); }

TokenMatrix zero_tokens(const std::vector<int>& experts_per_layer) {
  TokenMatrix m;
  for (int e : experts_per_layer) m.emplace_back(static_cast<size_t>(e), 0);
  return m;
}

TokenMatrix fit_tokens(const TokenMatrix& tokens, const std::vector<int>& experts_per_layer,
                       const std::string& name) {
  if (tokens.size() > experts_per_layer.size())
    fail(name, "token counts for " + std::to_string(tokens.size()) + " MoE layers, the checkpoint has " +
                   std::to_string(experts_per_layer.size()));
  // Every MoE layer must have counts: a layer missing from the file (another model's file, a trace cut
  // short) is not read as zeros. Experts past the end of a layer's counts are zeros: a trace
  // of routed ids lists an expert only once it got a token.
  if (tokens.size() < experts_per_layer.size())
    fail(name, "token counts for " + std::to_string(tokens.size()) + " MoE layers, the checkpoint has " +
                   std::to_string(experts_per_layer.size()) + " (a missing layer is not read as zeros)");
  for (size_t l = 0; l < tokens.size(); ++l)
    if (tokens[l].empty() && experts_per_layer[l] > 0) fail(name, "no token counts for MoE layer " + std::to_string(l));
  TokenMatrix out = zero_tokens(experts_per_layer);
  for (size_t l = 0; l < tokens.size(); ++l) {
    if (tokens[l].size() > out[l].size())
      fail(name, "MoE layer " + std::to_string(l) + " has counts for " + std::to_string(tokens[l].size()) +
                     " experts, the checkpoint has " + std::to_string(out[l].size()));
    std::copy(tokens[l].begin(), tokens[l].end(), out[l].begin());
  }
  return out;
}

TokenMatrix add_tokens(const TokenMatrix& a, const TokenMatrix& b) {
  TokenMatrix out = a;
  if (out.size() < b.size()) out.resize(b.size());
  for (size_t l = 0; l < b.size(); ++l) {
    if (out[l].size() < b[l].size()) out[l].resize(b[l].size(), 0);
    for (size_t e = 0; e < b[l].size(); ++e) out[l][e] = add_count(out[l][e], b[l][e], "token counts");
  }
  return out;
}

nlohmann::json tokens_to_json(const TokenMatrix& t) { return json(t); }

TokenMatrix tokens_from_json(const nlohmann::json& j, const std::string& name) {
  if (j.is_null()) return {};
  return parse_json_matrix(j, name, false);
}

std::string tokens_file_for_step(const std::string& path, int64_t step) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  const std::string stem = "step" + std::to_string(step);
  std::vector<std::string> found;
  for (const char* ext : {".json", ".csv", ".jsonl"})
    if (fs::is_regular_file(fs::path(path) / (stem + ext), ec)) found.push_back((fs::path(path) / (stem + ext)).string());
  if (found.empty()) fail(path, "no token counts for step " + std::to_string(step) + " (" + stem + ".json, .csv or .jsonl)");
  if (found.size() > 1) fail(path, "more than one token-count file for step " + std::to_string(step) + ": " + found[0] + ", " + found[1]);
  return found.front();
}

}  // namespace ucpkit::pec
