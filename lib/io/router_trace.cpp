// Router-trace JSONL parser.
#include "io/router_trace.h"

#include <climits>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/json_input.h"

namespace ucpkit::io {
namespace {

using json = nlohmann::json;

// The last integer a double (a JSON number) holds exactly.
constexpr double kMaxCount = 9007199254740992.0;

// The first of `keys` present in `o` (its value and its name), or {nullptr, ""}.
std::pair<const json*, std::string> first_key(const json& o, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (o.contains(k)) return {&o.at(k), k};
  return {nullptr, ""};
}

constexpr int64_t kMaxId = int64_t{1} << 31;  // layer, expert and num_experts values

// The fields of one line, each error naming the file, the line and the key.
class LineParser {
 public:
  LineParser(const std::string& name, size_t line) : name_(name), at_("line " + std::to_string(line) + ": ") {}

  [[noreturn]] void fail_line(const std::string& what) const { fail(name_, at_ + what); }

  int64_t integer(const json& v, const std::string& key, int64_t lo = 0, int64_t hi = kMaxId) const {
    return json_integer(v, name_, at_ + "\"" + key + "\"", lo, hi);
  }

  int64_t count(const json& v, const std::string& key) const {
    return integer(v, key, 0, static_cast<int64_t>(kMaxCount));
  }

  void flatten_ids(const json& v, const std::string& key, std::vector<int64_t>& out) const {
    if (v.is_array()) {
      for (const auto& x : v) flatten_ids(x, key, out);
    } else {
      out.push_back(integer(v, key, 0, kMaxId - 1));
    }
  }

 private:
  const std::string& name_;
  std::string at_;
};

int64_t add(int64_t a, int64_t b, const std::string& name) {
  int64_t s = 0;
  if (__builtin_add_overflow(a, b, &s)) fail(name, "token counts add up beyond the int64 range");
  return s;
}

}  // namespace

std::vector<std::vector<int64_t>> RouterTrace::total(const std::string& name) const {
  std::vector<std::vector<int64_t>> out(layers, std::vector<int64_t>(experts, 0));
  for (const auto& [it, m] : iterations)
    for (size_t l = 0; l < m.size(); ++l)
      for (size_t e = 0; e < m[l].size(); ++e) out[l][e] = add(out[l][e], m[l][e], name);
  return out;
}

RouterTrace parse_router_trace(std::string_view text, const std::string& name) {
  // iteration -> layer id -> expert -> count
  std::map<int64_t, std::map<int64_t, std::map<int64_t, int64_t>>> counts;
  std::set<int64_t> layer_ids;
  bool by_moe_layer = false, by_layer = false;
  int64_t experts = 0;
  std::istringstream in{std::string(text)};
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const LineParser p(name, line_no);
    const json o = parse_json_input(line, name, "line " + std::to_string(line_no) + ": not JSON");
    if (!o.is_object()) p.fail_line("expected a JSON object");
    int64_t layer = 0;
    if (auto [v, key] = first_key(o, {"moe_layer"}); v) {
      by_moe_layer = true;
      layer = p.integer(*v, key);
    } else if (auto [w, wkey] = first_key(o, {"layer", "layer_idx", "layer_number"}); w) {
      by_layer = true;
      layer = p.integer(*w, wkey);
    }
    int64_t iteration = 0;
    if (auto [v, key] = first_key(o, {"iteration", "step"}); v) iteration = p.integer(*v, key, 0, INT64_MAX);
    if (auto [v, key] = first_key(o, {"num_experts"}); v) experts = std::max(experts, p.integer(*v, key, 1));
    layer_ids.insert(layer);
    auto& row = counts[iteration][layer];
    auto put = [&](int64_t e, int64_t n) {
      row[e] = add(row[e], n, name);
      experts = std::max(experts, e + 1);
    };
    if (auto [c, key] = first_key(o, {"tokens_per_expert", "expert_counts", "counts"}); c) {
      if (!c->is_array()) p.fail_line("\"" + key + "\" must be a list, found " + json_brief(*c));
      if (c->size() > static_cast<size_t>(kMaxId)) p.fail_line("\"" + key + "\" lists too many experts");
      for (size_t e = 0; e < c->size(); ++e) put(static_cast<int64_t>(e), p.count((*c)[e], key + "[" + std::to_string(e) + "]"));
    } else if (auto [ids, ikey] = first_key(o, {"top_indices", "topk_ids", "experts", "indices", "expert_ids"}); ids) {
      if (!ids->is_array()) p.fail_line("\"" + ikey + "\" must be a list, found " + json_brief(*ids));
      std::vector<int64_t> flat;
      p.flatten_ids(*ids, ikey, flat);
      for (int64_t e : flat) put(e, 1);
    } else if (o.contains("expert") && o.contains("tokens")) {
      put(p.integer(o.at("expert"), "expert"), p.count(o.at("tokens"), "tokens"));
    } else {
      p.fail_line("no routed expert ids (top_indices, topk_ids, experts, indices, expert_ids) or per-expert counts "
                  "(tokens_per_expert, expert_counts, counts, or expert + tokens)");
    }
  }
  if (by_moe_layer && by_layer)
    fail(name, "mixes moe_layer with layer/layer_idx/layer_number keys; use one kind of layer index");
  RouterTrace t;
  if (counts.empty()) return t;
  // Layer ids -> MoE layer rows: moe_layer and ids that are exactly 0..L-1 as they are; otherwise
  // the i-th smallest transformer layer is MoE layer i.
  std::map<int64_t, size_t> row_of;
  const bool dense = *layer_ids.rbegin() == static_cast<int64_t>(layer_ids.size()) - 1;
  if (by_moe_layer || dense) {
    if (*layer_ids.rbegin() >= (int64_t{1} << 20)) fail(name, "MoE layer index " + std::to_string(*layer_ids.rbegin()) + " out of range");
    for (int64_t id : layer_ids) row_of[id] = static_cast<size_t>(id);
    t.layers = static_cast<size_t>(*layer_ids.rbegin()) + 1;
  } else {
    for (int64_t id : layer_ids) row_of.emplace(id, row_of.size());
    t.layers = layer_ids.size();
  }
  t.experts = static_cast<size_t>(experts);
  if (t.layers * t.experts > (size_t{1} << 28)) fail(name, "trace of " + std::to_string(t.layers) + " layers x " +
                                                               std::to_string(t.experts) + " experts is too large");
  for (const auto& [it, layers] : counts) {
    auto& m = t.iterations[it];
    m.assign(t.layers, std::vector<int64_t>(t.experts, 0));
    for (const auto& [l, ex] : layers)
      for (const auto& [e, n] : ex) m[row_of.at(l)][static_cast<size_t>(e)] = n;
  }
  return t;
}

}  // namespace ucpkit::io
