// The streaming plan reader (plan_scan.h, issue 31: --previous at 1,024 nodes under 500 MB): a plan
// read through read_plan equals the plan nlohmann's full parse of the same file gives to
// plan_from_json, for plans this tool writes (streamed) and for other spellings of valid plans
// (pretty-printed, floats 2.0, escapes, duplicate keys: the full parse's reading); and every broken
// file is refused as the full parse refuses it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <functional>
#include <random>
#include <unistd.h>
#include <string>

#include "core/error.h"
#include "placement/plan.h"
#include "placement/plan_scan.h"
#include "placement/planner.h"
#include "placement/replace.h"
#include "support/errors.h"

namespace plan_scan_test {

namespace fs = std::filesystem;
using namespace ucpkit::placement;
using ucpkit::testing::error_of;

namespace {

fs::path scratch() {
  fs::path d = fs::temp_directory_path() / ("plan_scan_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// A re-placement-sized plan in miniature: 3 layers of 12 experts on 4 x 2 x 3, f = 2, written by
// plan_json_text with a "replacement" holding transfers (which the reader skips, as "log2phy").
std::string written_plan() {
  LoadMatrix w;
  w.layers = 3;
  w.experts = 12;
  std::mt19937 rng(7);
  std::lognormal_distribution<double> d(5.0, 1.0);
  for (size_t i = 0; i < w.layers * w.experts; ++i) w.values.push_back(std::floor(d(rng)));
  PlacementOptions o;
  o.fault_tolerance = 2;
  Plan p = plan_placement(w, Cluster{4, 2, 3}, "balanced-ft", o);
  compute_metrics(p, w, o.recovery);
  nlohmann::json extra = {{"replacement", {{"copies_moved", 5}, {"transfers", {{{"layer", 0}, {"to_gpu", 1}}}}}}};
  return plan_json_text(p, extra);
}

// The plan nlohmann's DOM of `text` gives (no streaming involved).
Plan dom_plan(const std::string& text) { return plan_from_json(nlohmann::json::parse(text), "p.json"); }

void expect_same(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.cluster.nodes, b.cluster.nodes);
  EXPECT_EQ(a.cluster.gpus_per_node, b.cluster.gpus_per_node);
  EXPECT_EQ(a.cluster.slots_per_gpu, b.cluster.slots_per_gpu);
  EXPECT_EQ(a.algorithm, b.algorithm);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.fault_tolerance, b.fault_tolerance);
  EXPECT_EQ(a.node_ids, b.node_ids);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].phy2log, b.layers[l].phy2log) << l;
    EXPECT_EQ(a.layers[l].phyrank, b.layers[l].phyrank) << l;
  }
}

}  // namespace

TEST(PlanScan, WrittenPlansAreStreamedAndEqualTheFullParse) {
  const fs::path d = scratch();
  const std::string text = written_plan();
  write(d / "p.json", text);
  ASSERT_TRUE(scan_plan_file((d / "p.json").string(), {"nodes"}).has_value());  // the streamed form
  expect_same(read_plan((d / "p.json").string()), dom_plan(text));
  // node_ids of a plan after node loss, keys in another order (nlohmann's dump sorts them).
  nlohmann::json doc = nlohmann::json::parse(text);
  doc["node_ids"] = {3, 5, 6, 9};
  const std::string sorted = doc.dump();
  write(d / "s.json", sorted);
  ASSERT_TRUE(scan_plan_file((d / "s.json").string(), {"nodes"}).has_value());
  expect_same(read_plan((d / "s.json").string()), dom_plan(sorted));
  EXPECT_EQ(read_plan((d / "s.json").string()).node_ids, (std::vector<int>{3, 5, 6, 9}));
  fs::remove_all(d);
}

TEST(PlanScan, OtherSpellingsOfValidPlansReadAsTheFullParseReadsThem) {
  const fs::path d = scratch();
  const nlohmann::json doc = nlohmann::json::parse(written_plan());
  auto edited = [&](const std::function<void(std::string&)>& edit) {
    std::string t = doc.dump();
    edit(t);
    return t;
  };
  auto replace_first = [](std::string& t, const std::string& from, const std::string& to) {
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
  };
  const std::vector<std::string> variants = {
      doc.dump(2),                                                        // pretty-printed
      "\xEF\xBB\xBF" + doc.dump(),                                        // a byte-order mark
      edited([&](std::string& t) { t.insert(t.find(',', t.find("\"phy2log\":[")), ".0"); }),  // 2.0 for 2
      edited([&](std::string& t) { replace_first(t, "\"algorithm\":\"balanced-ft\"", "\"algorithm\":\"balanced\\u002dft\""); }),
      edited([&](std::string& t) { replace_first(t, "{\"algorithm\"", "{\"nodes\":99,\"algorithm\""); }),  // the last "nodes" counts
      edited([&](std::string& t) { replace_first(t, "\"metrics\":{", "\"metrics\":{\"note\":\"caf\xC3\xA9\","); }),
      edited([&](std::string& t) { replace_first(t, "\"metrics\":{", "\"metrics\":{\"big\":1e300,\"small\":-0.5E-3,"); }),
  };
  for (size_t i = 0; i < variants.size(); ++i) {
    write(d / "v.json", variants[i]);
    SCOPED_TRACE(i);
    expect_same(read_plan((d / "v.json").string()), dom_plan(variants[i]));
  }
  fs::remove_all(d);
}

TEST(PlanScan, BrokenFilesAreRefusedNamingTheFile) {
  const fs::path d = scratch();
  const std::string text = written_plan();
  const size_t p2l = text.find("\"phy2log\":[") + 11;
  // Not JSON (the streaming reader declines them; the full parse names the file).
  const std::vector<std::string> not_json = {
      text.substr(0, text.size() / 2),                               // truncated
      text.substr(0, text.size() - 2),                               // the last brace missing
      text + "x",                                                    // trailing bytes
      text.substr(0, p2l) + "01," + text.substr(p2l),                // a leading zero
      text.substr(0, 1) + "\"x\":1e999," + text.substr(1),           // a number no double holds
      text.substr(0, 1) + "\"x\":\"a\x01\"," + text.substr(1),       // a control byte in a string
      text.substr(0, 1) + "\"x\":tru," + text.substr(1),
      text.substr(0, 1) + "\"x\":" + std::string(100, '[') + std::string(100, ']') + "," + text.substr(1),
      "",
  };
  // JSON, but not a plan.
  const std::vector<std::string> not_plans = {
      text.substr(0, p2l) + "-1," + text.substr(p2l),                // a negative id
      text.substr(0, p2l) + "3.5," + text.substr(p2l),               // not an integer
      text.substr(0, p2l) + "\"3\"," + text.substr(p2l),             // a string
      text.substr(0, p2l) + "99999999999," + text.substr(p2l),       // beyond an int
      text.substr(0, p2l) + "0," + text.substr(p2l),                 // one slot too many
      text.substr(0, p2l - 11) + "\"phy2lo\":[" + text.substr(p2l),  // no phy2log in a layer
      "[]",
      "{}",
  };
  for (const auto* set : {&not_json, &not_plans})
    for (size_t i = 0; i < set->size(); ++i) {
      SCOPED_TRACE((set == &not_json ? "not JSON " : "not a plan ") + std::to_string(i));
      write(d / "b.json", (*set)[i]);
      const std::string m = error_of([&] { read_plan((d / "b.json").string()); }, "(read)");
      EXPECT_EQ(m.rfind((d / "b.json").string() + ": ", 0), 0u) << m;
      if (set == &not_json) {
        EXPECT_FALSE(scan_plan_file((d / "b.json").string(), {"nodes"}).has_value());
        EXPECT_NE(m.find(i + 1 == not_json.size() - 1 ? "nested deeper" : "not valid JSON"), std::string::npos) << m;
      }
    }
  const std::string missing = error_of([&] { read_plan((d / "none.json").string()); });
  EXPECT_NE(missing.find("none.json"), std::string::npos) << missing;
  fs::remove_all(d);
}

// log2phy's padding is skipped sixteen elements at a time: runs of every length around those steps, and a
// break at every position of a run, read as the full parse reads them (a break is not JSON: refused).
TEST(PlanScan, PaddingRunsOfAnyLengthAndBreaksInThemReadAsTheFullParse) {
  const fs::path d = scratch();
  const std::string text = written_plan();
  auto with_run = [&](const std::string& run) { return text.substr(0, 1) + "\"pad\":[" + run + "]," + text.substr(1); };
  auto padding = [](int n) {
    std::string r;
    for (int i = 0; i < n; ++i) r += "-1,";
    return r;
  };
  for (int n : {0, 1, 7, 8, 15, 16, 17, 23, 24, 31, 32, 33, 47, 48, 49, 100}) {
    SCOPED_TRACE(n);
    const std::string t = with_run(padding(n) + "5,-1,12");
    write(d / "r.json", t);
    ASSERT_TRUE(scan_plan_file((d / "r.json").string(), {"nodes"}).has_value());
    expect_same(read_plan((d / "r.json").string()), dom_plan(t));
  }
  const std::string run = padding(40) + "-1";
  for (size_t at = 0; at < run.size(); ++at) {
    SCOPED_TRACE(at);
    std::string broken = run;
    broken[at] = run[at] == '-' ? '+' : run[at] == '1' ? 'x' : ';';
    write(d / "b.json", with_run(broken));
    EXPECT_FALSE(scan_plan_file((d / "b.json").string(), {"nodes"}).has_value());
    const std::string m = error_of([&] { read_plan((d / "b.json").string()); }, "(read)");
    EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
  }
  fs::remove_all(d);
}

// The plan file written in pieces (write_plan_json, what --previous and node loss stream to disk)
// is the text plan_json_text builds whole, whatever the piece size, transfers included.
TEST(PlanWrite, PiecesMakeTheWholeText) {
  const nlohmann::json doc = nlohmann::json::parse(written_plan());
  Plan plan = plan_from_json(doc, "p.json");
  ReplaceResult rr;
  for (int i = 0; i < 5000; ++i) rr.transfers.push_back({i % 3, i % 12, i % 24, (i + 1) % 24, i / 100});
  const nlohmann::json extra = {{"replacement", {{"copies_moved", 5000}, {"transfers", kTransfersPlaceholder}}}};
  const std::string whole =
      plan_json_text(plan, extra, {{nlohmann::json(kTransfersPlaceholder).dump(), transfers_json_text(rr)}});
  const nlohmann::json parsed = nlohmann::json::parse(whole);
  ASSERT_EQ(parsed["replacement"]["transfers"].size(), 5000u);
  EXPECT_EQ(parsed["replacement"]["transfers"][4999]["round"], 49);
  for (size_t chunk : {size_t{1}, size_t{100}, size_t{1} << 20}) {
    std::string pieces;
    size_t calls = 0;
    write_plan_json(plan, extra,
                    {{nlohmann::json(kTransfersPlaceholder).dump(),
                      [&](const TextSink& s) { write_transfers_json(rr, nullptr, 1, s); }}},
                    [&](std::string_view p) {
                      pieces.append(p);
                      ++calls;
                    },
                    chunk);
    EXPECT_EQ(pieces, whole) << chunk;
    if (chunk == 1) EXPECT_GT(calls, 3u);
    // Issue 31, sixth pass: log2phy goes out row by row (a layer's rows are 6 MB at 1,024 nodes),
    // so with pieces of one byte every row of every layer is a piece of its own.
    if (chunk == 1) EXPECT_GE(calls, plan.layers.size() * static_cast<size_t>(plan.experts));
  }
}

// The plan text's log2phy is built without the padded table since issue 31's fifth pass: every row
// equals log2phy() (cluster.h), for ranks as placements make them and for ranks that are not
// (duplicates, gaps, a rank at or beyond the replica count, beyond the width).
TEST(PlanWrite, Log2phyRowsEqualTheTable) {
  Plan plan = dom_plan(written_plan());
  std::mt19937 rng(11);
  for (int round = 0; round < 4; ++round) {
    if (round > 0)
      for (auto& layer : plan.layers)
        for (size_t p = 0; p < layer.phyrank.size(); ++p)
          if (rng() % 4 == 0) layer.phyrank[p] = static_cast<int>(rng() % (3 + round * 3));
    const nlohmann::json doc = nlohmann::json::parse(plan_json_text(plan, nlohmann::json::object()));
    int width = 1;
    for (const auto& layer : plan.layers)
      for (int c : logical_counts(layer.phy2log, plan.experts)) width = std::max(width, c);
    for (size_t l = 0; l < plan.layers.size(); ++l)
      EXPECT_EQ(doc["layers"][l]["log2phy"].get<std::vector<std::vector<int>>>(),
                log2phy(plan.layers[l], plan.experts, width))
          << "round " << round << " layer " << l;
  }
}

}  // namespace plan_scan_test
