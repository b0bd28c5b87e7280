// Placement benchmark: time per phase (place, metrics, JSON) for a synthetic skewed load matrix,
// scaling over nodes and experts, and a quality table for a given loads file.
// Usage: bench_placement speed <layers> <experts> <nodes> <gpus> <slots> [algorithm] [f]
//        bench_placement quality <loads> <nodes> <gpus> <slots> <f> [window]
//        bench_placement replace <layers> <experts> <nodes> <gpus> <slots> [migration_weight]
//        bench_placement nodeloss <layers> <experts> <nodes> <gpus> <slots> [migration_weight]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "placement/balance.h"
#include "placement/dispatch.h"
#include "placement/planner.h"
#include "placement/node_loss.h"
#include "placement/replace.h"

using namespace ucpkit::placement;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double cpu() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// Log-normal token counts (sigma 1): a few hot experts per layer, like real router statistics.
LoadMatrix synthetic(int layers, int experts, unsigned seed) {
  LoadMatrix w;
  w.layers = layers;
  w.experts = experts;
  std::mt19937 rng(seed);
  std::lognormal_distribution<double> d(8.0, 1.0);
  for (int i = 0; i < layers * experts; ++i) w.values.push_back(std::floor(d(rng)));
  return w;
}

int speed(int argc, char** argv) {
  int L = std::atoi(argv[2]), E = std::atoi(argv[3]);
  Cluster cl{std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6])};
  std::string algo = argc > 7 ? argv[7] : "lazarus";
  PlacementOptions o;
  o.fault_tolerance = argc > 8 ? std::atoi(argv[8]) : 2;
  LoadMatrix w = synthetic(L, E, 1);
  double t0 = now(), c0 = cpu();
  Plan p = plan_placement(w, cl, algo, o);
  double t1 = now(), c1 = cpu();
  compute_metrics(p, w, o.recovery);
  double t2 = now(), c2 = cpu();
  // The plan file's text as moe-replace makes it: in pieces (write_plan_json), counted, not kept.
  size_t json_bytes = 0;
  write_plan_json(p, nlohmann::json::object(), {}, [&](std::string_view piece) { json_bytes += piece.size(); });
  double t3 = now(), c3 = cpu();
  // Token dispatch plan (--dispatch), timed apart: not part of the placement target.
  double dmean = 0, dmax = 0;
  for (size_t l = 0; l < p.layers.size(); ++l) {
    DispatchPlan d = dispatch_plan(p.layers[l].phy2log, w.layer_vector(l), cl);
    dmean += d.mean_load, dmax += d.max_load;
  }
  double c4 = cpu();
  std::printf(
      "{\"algorithm\":\"%s\",\"layers\":%d,\"experts\":%d,\"nodes\":%d,\"gpus_per_node\":%d,\"slots_per_gpu\":%d,"
      "\"place_cpu_s\":%.4f,\"metrics_cpu_s\":%.4f,\"json_cpu_s\":%.4f,\"total_cpu_s\":%.4f,\"total_wall_s\":%.4f,"
      "\"dispatch_cpu_s\":%.4f,\"dispatch_balancedness\":%.4f,"
      "\"balancedness\":%.4f,\"p1\":%.6f,\"p2\":%.6f,\"p3\":%.6f,\"p4\":%.6f,\"json_bytes\":%zu}\n",
      p.algorithm.c_str(), L, E, cl.nodes, cl.gpus_per_node, cl.slots_per_gpu, c1 - c0, c2 - c1, c3 - c2, c3 - c0,
      t3 - t0, c4 - c3, dmax > 0 ? dmean / dmax : 1.0, p.metrics.balancedness, p.metrics.recovery.size() > 0 ? p.metrics.recovery[0].probability : 1.0,
      p.metrics.recovery.size() > 1 ? p.metrics.recovery[1].probability : 1.0,
      p.metrics.recovery.size() > 2 ? p.metrics.recovery[2].probability : 1.0,
      p.metrics.recovery.size() > 3 ? p.metrics.recovery[3].probability : 1.0, json_bytes);
  return 0;
}

// Re-placement after a load drift (each load times a log-normal factor, sigma 0.5): the previous
// plan is balanced-ft for the old loads; timed: replace_with_migration (which includes a balanced-ft
// placement from scratch as an option) against eplb-global re-run from scratch.
int replace(int argc, char** argv) {
  int L = std::atoi(argv[2]), E = std::atoi(argv[3]);
  Cluster cl{std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6])};
  double weight = argc > 7 ? std::atof(argv[7]) : 0.0;
  PlacementOptions o;
  o.fault_tolerance = 2;
  LoadMatrix w0 = synthetic(L, E, 1), w1 = w0;
  std::mt19937 rng(2);
  std::lognormal_distribution<double> drift(0.0, 0.5);
  for (auto& v : w1.values) v = std::floor(v * drift(rng));
  Plan prev = plan_placement(w0, cl, "balanced-ft", o);
  std::vector<std::vector<int>> before;
  for (const auto& l : prev.layers) before.push_back(l.phy2log);
  ReplaceOptions ro;
  ro.fault_tolerance = 2;
  ro.migration_weight = weight;
  double c0 = cpu();
  ReplaceResult r = replace_with_migration(before, w1, cl, ro);
  double c1 = cpu();
  Plan eplb = plan_placement(w1, cl, "eplb-global", o);
  double c2 = cpu();
  auto overall = [&](const std::vector<LayerPlacement>& layers) {
    double mean = 0, mx = 0;
    for (size_t l = 0; l < layers.size(); ++l) {
      auto g = gpu_loads(layers[l].phy2log, w1.layer_vector(l), cl);
      for (double x : g) mean += x / static_cast<double>(g.size());
      mx += *std::max_element(g.begin(), g.end());
    }
    return mean / mx;
  };
  long long eplb_copies = 0;
  for (size_t l = 0; l < before.size(); ++l) eplb_copies += copies_between(before[l], eplb.layers[l].phy2log, cl);
  std::printf(
      "{\"mode\":\"replace\",\"layers\":%d,\"experts\":%d,\"nodes\":%d,\"gpus_per_node\":%d,\"slots_per_gpu\":%d,"
      "\"migration_weight\":%g,\"replace_cpu_s\":%.4f,\"previous_balancedness\":%.4f,\"balancedness\":%.4f,"
      "\"copies\":%lld,\"mandatory\":%lld,\"layers_from_scratch\":%d,\"rounds\":%d,\"round_lower_bound\":%d,"
      "\"eplb_scratch_cpu_s\":%.4f,\"eplb_scratch_balancedness\":%.4f,\"eplb_scratch_copies\":%lld,\"slots\":%lld}\n",
      L, E, cl.nodes, cl.gpus_per_node, cl.slots_per_gpu, weight, c1 - c0, overall(prev.layers), overall(r.layers),
      r.copies, r.mandatory_copies, r.layers_from_scratch, r.rounds, r.round_lower_bound, c2 - c1, overall(eplb.layers),
      eplb_copies, static_cast<long long>(L) * cl.slots());
  return 0;
}

// Node loss under the migration model: the current plan is balanced-ft (f = 2) for the loads, node 0
// fails; timed: replace_after_node_loss (its balanced-ft placement from scratch included).
int nodeloss(int argc, char** argv) {
  int L = std::atoi(argv[2]), E = std::atoi(argv[3]);
  Cluster cl{std::atoi(argv[4]), std::atoi(argv[5]), std::atoi(argv[6])};
  ReplaceOptions ro;
  ro.fault_tolerance = 2;
  ro.migration_weight = argc > 7 ? std::atof(argv[7]) : 0.0;
  PlacementOptions o;
  o.fault_tolerance = 2;
  LoadMatrix w = synthetic(L, E, 1);
  Plan cur = plan_placement(w, cl, "balanced-ft", o);
  std::vector<int> physical;
  for (int i = 1; i < cl.nodes; ++i) physical.push_back(i);
  Cluster target{cl.nodes - 1, cl.gpus_per_node, cl.slots_per_gpu};
  Plan next;
  double c0 = cpu();
  NodeLossResult r = replace_after_node_loss(cur, physical, w, target, ro, next);
  double c1 = cpu();
  compute_metrics(next, w, o.recovery);
  std::printf("{\"mode\":\"nodeloss\",\"layers\":%d,\"experts\":%d,\"nodes\":%d,\"migration_weight\":%g,"
              "\"replace_cpu_s\":%.4f,\"fetches\":%lld,\"gpu_copies\":%lld,\"rounds\":%d,\"balancedness\":%.4f}\n",
              L, E, cl.nodes, ro.migration_weight, c1 - c0, r.fetches.replicas_moved, r.replacement.copies,
              r.replacement.rounds, next.metrics.balancedness);
  return 0;
}

int quality(int argc, char** argv) {
  LoadFileOptions lo;
  if (argc > 7) lo.window = static_cast<size_t>(std::atoi(argv[7]));
  LoadMatrix w = read_loads(argv[2], lo);
  Cluster cl{std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5])};
  PlacementOptions o;
  o.fault_tolerance = std::atoi(argv[6]);
  o.recovery.max_failures = 4;
  std::printf("| algorithm | balancedness | min balancedness | p(1) | p(2) | p(3) | p(4) |\n|---|---|---|---|---|---|---|\n");
  for (const char* algo : {"balanced-ft", "lazarus", "eplb", "eplb-global", "spread", "compact", "hecate"}) {
    Plan p = plan_placement(w, cl, algo, o);
    compute_metrics(p, w, o.recovery);
    std::printf("| %s | %.4f | %.4f", algo, p.metrics.balancedness, p.metrics.min_balancedness);
    for (const auto& r : p.metrics.recovery) std::printf(" | %.4f%s", r.probability, r.exact ? "" : "*");
    std::printf(" |\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "speed" && argc >= 7) return speed(argc, argv);
    if (mode == "quality" && argc >= 7) return quality(argc, argv);
    if (mode == "replace" && argc >= 7) return replace(argc, argv);
    if (mode == "nodeloss" && argc >= 7) return nodeloss(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_placement: error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: bench_placement speed <layers> <experts> <nodes> <gpus> <slots> [algorithm] [f]\n"
               "       bench_placement quality <loads> <nodes> <gpus> <slots> <f> [window]\n"
               "       bench_placement replace <layers> <experts> <nodes> <gpus> <slots> [migration_weight]\n"
               "       bench_placement nodeloss <layers> <experts> <nodes> <gpus> <slots> [migration_weight]\n");
  return 2;
}
