// Plan metrics and the plan JSON schema in one place.
#include "placement/plan.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/json_input.h"
#include "placement/balance.h"
#include "placement/cluster_request.h"
#include "placement/plan_scan.h"

namespace ucpkit::placement {
namespace {

using json = nlohmann::json;

double round6(double v) { return std::round(v * 1e6) / 1e6; }

json recovery_json(const std::vector<RecoveryEstimate>& r) {
  json o = json::object();
  for (const auto& e : r) o[std::to_string(e.failed_nodes)] = e.probability;
  return o;
}

json recovery_detail(const std::vector<RecoveryEstimate>& r) {
  json o = json::object();
  for (const auto& e : r) {
    json d = {{"method", e.exact ? "exact" : "monte_carlo"}};
    if (!e.exact) {
      d["samples"] = e.samples;
      d["ci95"] = {e.ci_low, e.ci_high};
    }
    o[std::to_string(e.failed_nodes)] = d;
  }
  return o;
}

}  // namespace

void compute_metrics(Plan& plan, const LoadMatrix& loads, const RecoveryOptions& options) {
  plan.recovery_options = options;
  RecoveryModel model(plan.cluster.nodes, options);
  auto survivals = model.new_survivals();
  plan.layer_metrics.clear();
  std::vector<std::vector<RecoveryEstimate>> per_layer;
  double sum_mean = 0, sum_max = 0, min_b = 1;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    LayerMetrics m;
    std::vector<double> t = loads.layer_vector(l);
    m.gpu_loads = gpu_loads(plan.layers[l].phy2log, t, plan.cluster);
    m.max_load = *std::max_element(m.gpu_loads.begin(), m.gpu_loads.end());
    m.mean_load = std::accumulate(m.gpu_loads.begin(), m.gpu_loads.end(), 0.0) / m.gpu_loads.size();
    m.balancedness = balancedness(m.gpu_loads);
    m.recovery = model.evaluate(ExpertNodeSets::from_layer(plan.layers[l].phy2log, plan.cluster, plan.experts),
                                &survivals);
    sum_mean += m.mean_load;
    sum_max += m.max_load;
    min_b = std::min(min_b, m.balancedness);
    per_layer.push_back(m.recovery);
    plan.layer_metrics.push_back(std::move(m));
  }
  plan.metrics.balancedness = sum_max > 0 ? sum_mean / sum_max : 1.0;
  plan.metrics.min_balancedness = min_b;
  plan.metrics.recovery = model.aggregate(per_layer, survivals);
}

namespace {

int log2phy_width(const Plan& plan, std::vector<std::vector<int>>& counts) {
  int width = 1;
  for (const auto& layer : plan.layers) {
    counts.push_back(logical_counts(layer.phy2log, plan.experts));
    width = std::max(width, *std::max_element(counts.back().begin(), counts.back().end()));
  }
  return width;
}

// Everything but "layers" (small).
json plan_header(const Plan& plan) {
  json doc = {{"nodes", plan.cluster.nodes},
              {"gpus_per_node", plan.cluster.gpus_per_node},
              {"slots_per_gpu", plan.cluster.slots_per_gpu},
              {"algorithm", plan.algorithm},
              {"experts", plan.experts},
              {"fault_tolerance", plan.fault_tolerance},
              {"survives_node_failures", plan.fault_tolerance - 1}};
  if (!plan.node_ids.empty()) doc["node_ids"] = plan.node_ids;
  json metrics = {{"balancedness", plan.metrics.balancedness},
                  {"min_balancedness", plan.metrics.min_balancedness},
                  {"recovery_probability", recovery_json(plan.metrics.recovery)}};
  json ci = json::object();
  for (const auto& e : plan.metrics.recovery) ci[std::to_string(e.failed_nodes)] = {e.ci_low, e.ci_high};
  metrics["recovery_ci95"] = ci;
  metrics["recovery_method"] = recovery_detail(plan.metrics.recovery);
  metrics["monte_carlo"] = {{"samples", plan.recovery_options.mc_samples},
                            {"seed", plan.recovery_options.seed},
                            {"exact_limit", plan.recovery_options.exact_limit}};
  doc["metrics"] = std::move(metrics);
  for (auto it = plan.details.begin(); it != plan.details.end(); ++it) doc[it.key()] = it.value();
  return doc;
}

// Small per-layer keys; the big integer arrays are written separately.
json layer_small(const Plan& plan, size_t l) {
  json L = json::object();
  if (l < plan.layer_metrics.size()) {
    const auto& m = plan.layer_metrics[l];
    L["balancedness"] = m.balancedness;
    L["recovery_probability"] = recovery_json(m.recovery);
    L["recovery_method"] = recovery_detail(m.recovery);
    json g = json::array();
    for (double v : m.gpu_loads) g.push_back(round6(v));
    L["gpu_loads"] = g;
    L["max_gpu_load"] = m.max_load;
    L["mean_gpu_load"] = m.mean_load;
  }
  return L;
}

void append_ints(std::string& out, const int* v, size_t n) {
  out += '[';
  char buf[16];
  for (size_t i = 0; i < n; ++i) {
    if (i) out += ',';
    auto r = std::to_chars(buf, buf + sizeof buf, v[i]);
    out.append(buf, r.ptr);
  }
  out += ']';
}

void append_ints(std::string& out, const std::vector<int>& v) { append_ints(out, v.data(), v.size()); }

}  // namespace

json plan_to_json(const Plan& plan) { return json::parse(plan_json_text(plan)); }

void write_plan_json(const Plan& plan, const json& extra, const std::vector<std::pair<std::string, RawWriter>>& raw,
                     const TextSink& sink, size_t chunk) {
  constexpr size_t kPaddingPiece = 4096;
  std::vector<std::vector<int>> counts;
  const int width = log2phy_width(plan, counts);
  std::string padding;
  for (int i = 0; i < width; ++i) padding += ",-1";
  json head = plan_header(plan);
  for (auto it = extra.begin(); it != extra.end(); ++it) head[it.key()] = it.value();
  std::string text = head.dump();
  // Each placeholder's value written in its place, first to last.
  std::vector<std::pair<size_t, size_t>> at;  // (offset in text, index in raw)
  for (size_t i = 0; i < raw.size(); ++i)
    if (size_t p = text.find(raw[i].first); p != std::string::npos) at.push_back({p, i});
  std::sort(at.begin(), at.end());
  // With a chunk size, the text goes to the sink whenever it holds that much (so a plan of hundreds
  // of MB is never held whole); without, it is the whole document, reserved once: growing a ~20 MB
  // string by doubling copies and page-faults it again at every step. Ids (phy2log and log2phy)
  // take at most 7 characters with the comma, padding 3, GPU loads about 24.
  std::string out;
  auto flush = [&](bool force) {
    if (chunk > 0 && (force || out.size() >= chunk)) {
      sink(out);
      out.clear();
    }
  };
  if (chunk > 0) {
    out.reserve(chunk + (size_t{1} << 20));
  } else {
    size_t estimate = text.size() + 64;
    for (size_t l = 0; l < plan.layers.size(); ++l)
      estimate += 14 * plan.layers[l].phy2log.size() + static_cast<size_t>(plan.experts) * (3 * width + 12) +
                  24 * static_cast<size_t>(plan.cluster.gpus()) + 4096;
    out.reserve(estimate);
  }
  size_t from = 0;
  for (const auto& [p, i] : at) {
    out.append(text, from, p - from);
    flush(true);
    raw[i].second([&](std::string_view piece) {
      out.append(piece);
      flush(false);
    });
    from = p + raw[i].first.size();
  }
  out.append(text, from, text.size() - 1 - from);  // the head without its closing brace: "layers" follows
  out += ",\"layers\":[";
  std::vector<size_t> start;
  std::vector<int> ids, row;
  std::vector<char> irregular;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    if (l) out += ',';
    out += "{\"phy2log\":";
    append_ints(out, plan.layers[l].phy2log);
    out += ",\"log2phy\":[";
    // log2phy (cluster.h) without its padding in memory: per expert the slots of its ranks below
    // its replica count; an expert with a slot of a rank at or above its count (a plan whose
    // phyrank is not ranks_by_appearance's) gets its whole row as log2phy makes it.
    const LayerPlacement& layer = plan.layers[l];
    const std::vector<int>& cnt = counts[l];
    const size_t E = static_cast<size_t>(plan.experts);
    start.assign(E + 1, 0);
    for (size_t e = 0; e < E; ++e) start[e + 1] = start[e] + static_cast<size_t>(std::max(0, cnt[e]));
    ids.assign(start[E], -1);
    irregular.assign(E, 0);
    for (size_t p = 0; p < layer.phy2log.size(); ++p) {
      const int e = layer.phy2log[p], r = layer.phyrank[p];
      if (r >= 0 && r < cnt[e]) ids[start[e] + static_cast<size_t>(r)] = static_cast<int>(p);
      else if (r < width) irregular[e] = 1;
    }
    for (size_t e = 0; e < E; ++e) {
      if (e) out += ',';
      // The valid ids, then the -1 padding as one append (most of a padded log2phy is padding).
      const size_t valid = static_cast<size_t>(std::max(0, cnt[e]));
      if (!irregular[e] && valid > 0 && valid < static_cast<size_t>(width)) {
        append_ints(out, ids.data() + start[e], valid);
        out.pop_back();  // reopen the list
        const std::string_view pad = std::string_view(padding).substr(0, 3 * (static_cast<size_t>(width) - valid));
        if (chunk > 0 && pad.size() >= kPaddingPiece) {
          // A long padding goes to the sink as it is: with a few dominant experts (thousands of
          // replicas) nearly all of a plan's 1.4 GB is padding, and copying it into `out` first
          // cost about 0.2 s a plan.
          flush(true);
          sink(pad);
        } else {
          out.append(pad);
        }
        out += ']';
        flush(false);  // per row, not per layer: a layer's log2phy is 6 MB at 1,024 nodes
        continue;
      }
      row.assign(static_cast<size_t>(width), -1);
      if (!irregular[e]) {
        std::copy_n(ids.begin() + static_cast<std::ptrdiff_t>(start[e]), valid, row.begin());
      } else {
        for (size_t p = 0; p < layer.phy2log.size(); ++p)
          if (layer.phy2log[p] == static_cast<int>(e) && layer.phyrank[p] >= 0 && layer.phyrank[p] < width)
            row[static_cast<size_t>(layer.phyrank[p])] = static_cast<int>(p);
      }
      append_ints(out, row);
      flush(false);
    }
    out += "],\"logcnt\":";
    append_ints(out, counts[l]);
    std::string small = layer_small(plan, l).dump();
    if (small.size() > 2) {
      out += ',';
      out.append(small, 1, small.size() - 2);
    }
    out += '}';
    flush(false);
  }
  out += "]}\n";
  if (chunk > 0) flush(true);
  else sink(out);
}

std::string plan_json_text(const Plan& plan, const json& extra,
                           const std::vector<std::pair<std::string, std::string>>& raw) {
  std::vector<std::pair<std::string, RawWriter>> writers;
  for (const auto& [placeholder, value] : raw)
    writers.push_back({placeholder, [&value](const TextSink& sink) { sink(value); }});
  std::string text;
  write_plan_json(
      plan, extra, writers, [&](std::string_view whole) { text = whole; }, 0);
  return text;
}

int guaranteed_fault_tolerance(const Plan& plan) {
  const int c = plan.cluster.slots_per_node();
  int least = plan.cluster.nodes;
  std::vector<int> last_node(plan.experts), degree(plan.experts);
  for (const auto& layer : plan.layers) {
    std::fill(last_node.begin(), last_node.end(), -1);
    std::fill(degree.begin(), degree.end(), 0);
    for (size_t p = 0; p < layer.phy2log.size(); ++p) {
      int e = layer.phy2log[p], n = static_cast<int>(p) / c;
      if (last_node[e] != n) {  // slots are node-major, so a node's slots are consecutive
        last_node[e] = n;
        degree[e]++;
      }
    }
    for (int d : degree) least = std::min(least, d);
  }
  return least;
}

namespace {

// The fault tolerance f a plan file records ("fault_tolerance", else "survives_node_failures" + 1),
// or, for a plan that records neither (written by another tool), the one its placement guarantees.
// A recorded f its placement does not hold is refused.
int recorded_fault_tolerance(const json& doc, const Plan& plan, const std::string& name) {
  const int holds = guaranteed_fault_tolerance(plan);
  int f = holds;
  if (doc.contains("fault_tolerance"))
    f = static_cast<int>(json_integer(doc["fault_tolerance"], name, "\"fault_tolerance\"", 1, plan.cluster.nodes));
  else if (doc.contains("survives_node_failures"))
    f = 1 + static_cast<int>(json_integer(doc["survives_node_failures"], name, "\"survives_node_failures\"", 0,
                                          plan.cluster.nodes - 1));
  if (f > holds)
    fail(name, "the plan records fault_tolerance " + std::to_string(f) + " (" + survives_text(f) +
                   ") but some expert sits on only " + std::to_string(holds) + " node(s)");
  return f;
}

}  // namespace

namespace {

constexpr long long kIntMax = std::numeric_limits<int>::max();

// The keys of a plan before its layers: an object with the sizes and "layers", the cluster, the
// algorithm. Every value is checked for its type where it is read, so a wrong one is named by its key.
void plan_head_from_json(const json& doc, const std::string& name, Plan& plan) {
  auto integer = [&](const json& v, const std::string& where, long long lo = 0) {
    return static_cast<int>(json_integer(v, name, where, lo, kIntMax));
  };
  if (!doc.is_object()) fail(name, "a plan must be a JSON object");
  for (const char* key : {"nodes", "gpus_per_node", "slots_per_gpu", "layers"})
    if (!doc.contains(key)) fail(name, std::string("plan lacks \"") + key + "\"");
  plan.cluster = {integer(doc["nodes"], "\"nodes\"", 1), integer(doc["gpus_per_node"], "\"gpus_per_node\"", 1),
                  integer(doc["slots_per_gpu"], "\"slots_per_gpu\"", 1)};
  if (1LL * plan.cluster.nodes * plan.cluster.gpus_per_node * plan.cluster.slots_per_gpu > kIntMax / 4)
    fail(name, "plan cluster too large: " + plan.cluster.describe());
  plan.algorithm = "unknown";
  if (doc.contains("algorithm")) {
    if (!doc["algorithm"].is_string())
      fail(name, "\"algorithm\" must be a string, found " + json_brief(doc["algorithm"]));
    plan.algorithm = doc["algorithm"].get<std::string>();
  }
}

// The keys after the layers (plan.layers read, max_e their largest expert id): experts, node ids,
// fault tolerance.
void plan_tail_from_json(const json& doc, const std::string& name, Plan& plan, int max_e) {
  auto integer = [&](const json& v, const std::string& where, long long lo = 0) {
    return static_cast<int>(json_integer(v, name, where, lo, kIntMax));
  };
  auto list = [&](const json& v, const std::string& where) -> const json& {
    if (!v.is_array()) fail(name, where + " must be a list, found " + json_brief(v));
    return v;
  };
  if (plan.layers.empty()) fail(name, "plan has no layers");
  plan.experts = doc.contains("experts") ? integer(doc["experts"], "\"experts\"", 1) : max_e + 1;
  if (plan.experts <= max_e) fail(name, "phy2log holds an expert id beyond \"experts\"");
  for (auto& lp : plan.layers) lp.phyrank = ranks_by_appearance(lp.phy2log, plan.experts);
  if (doc.contains("node_ids")) {
    const json& ids = list(doc["node_ids"], "\"node_ids\"");
    if (static_cast<int>(ids.size()) != plan.cluster.nodes) fail(name, "node_ids does not list every node");
    for (size_t i = 0; i < ids.size(); ++i)
      plan.node_ids.push_back(integer(ids[i], "node_ids[" + std::to_string(i) + "]"));
  } else {
    plan.node_ids.resize(plan.cluster.nodes);
    std::iota(plan.node_ids.begin(), plan.node_ids.end(), 0);
  }
  plan.fault_tolerance = recorded_fault_tolerance(doc, plan, name);
}

}  // namespace

Plan plan_from_json(const json& doc, const std::string& name) {
  auto integer = [&](const json& v, const std::string& where, long long lo = 0) {
    return static_cast<int>(json_integer(v, name, where, lo, kIntMax));
  };
  auto list = [&](const json& v, const std::string& where) -> const json& {
    if (!v.is_array()) fail(name, where + " must be a list, found " + json_brief(v));
    return v;
  };
  Plan plan;
  try {
    plan_head_from_json(doc, name, plan);
    int max_e = -1;
    const json& layers = list(doc["layers"], "\"layers\"");
    for (size_t l = 0; l < layers.size(); ++l) {
      const std::string at = "layers[" + std::to_string(l) + "]";
      if (!layers[l].is_object() || !layers[l].contains("phy2log"))
        fail(name, at + " must be an object with \"phy2log\", found " + json_brief(layers[l]));
      const json& p2l = list(layers[l]["phy2log"], at + ".phy2log");
      if (static_cast<long long>(p2l.size()) != plan.cluster.slots())
        fail(name, at + ".phy2log has " + std::to_string(p2l.size()) + " slots, expected " +
                       std::to_string(plan.cluster.slots()));
      LayerPlacement lp;
      lp.phy2log.reserve(p2l.size());
      for (size_t p = 0; p < p2l.size(); ++p) {
        const int e = integer(p2l[p], at + ".phy2log[" + std::to_string(p) + "]");
        max_e = std::max(max_e, e);
        lp.phy2log.push_back(e);
      }
      plan.layers.push_back(std::move(lp));
    }
    plan_tail_from_json(doc, name, plan, max_e);
  } catch (const nlohmann::json::exception& e) {
    fail(name, "malformed plan: " + escaped_brief(e.what(), 160));
  }
  return plan;
}

namespace {

// The plan file without what plan_from_json never reads: every "log2phy" (padded to the largest
// replica count) and "transfers" list, most of a large plan (400 MB at 1,024 nodes,
// --previous under 500 MB). Nesting is bounded as parse_json_input bounds it (core/json_input.h).
json parse_plan_file(const std::string& text, const std::string& path) {
  struct TooDeep {};
  try {
    auto skip = [](int depth, json::parse_event_t event, json& parsed) {
      if ((event == json::parse_event_t::array_start || event == json::parse_event_t::object_start) &&
          depth >= kMaxJsonDepth)
        throw TooDeep{};
      return !(event == json::parse_event_t::key && (parsed == "log2phy" || parsed == "transfers"));
    };
    return json::parse(text, skip);
  } catch (const TooDeep&) {
    fail(path, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  } catch (const json::exception& e) {
    fail(path, "not valid JSON: " + escaped_brief(e.what(), 160));
  }
}

// The plan as plan_from_json reads it, from a file in the plain form scan_plan_file streams (never
// the document in memory); nullopt for anything else or anything wrong, which the full parse then
// names exactly as before.
std::optional<Plan> read_plan_streaming(const std::string& path) {
  std::optional<ScannedPlan> scanned = scan_plan_file(
      path, {"nodes", "gpus_per_node", "slots_per_gpu", "algorithm", "experts", "node_ids", "fault_tolerance",
             "survives_node_failures"});
  if (!scanned || !scanned->has_layers) return std::nullopt;
  try {
    json& doc = scanned->head;
    doc["layers"] = nullptr;  // present; its content is in scanned->phy2log
    Plan plan;
    plan_head_from_json(doc, path, plan);
    int max_e = -1;
    for (auto& p2l : scanned->phy2log) {
      if (static_cast<long long>(p2l.size()) != plan.cluster.slots()) return std::nullopt;
      for (int e : p2l) max_e = std::max(max_e, e);
      LayerPlacement lp;
      lp.phy2log = std::move(p2l);
      plan.layers.push_back(std::move(lp));
    }
    plan_tail_from_json(doc, path, plan, max_e);
    return plan;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

Plan read_plan(const std::string& path) {
  if (std::optional<Plan> plan = read_plan_streaming(path)) return std::move(*plan);
  json doc = parse_plan_file(read_text_file(path), path);
  return plan_from_json(doc, path);
}

}  // namespace ucpkit::placement
