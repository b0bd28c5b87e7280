// moe-replace pipeline.
#include "placement/planner.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "placement/balance.h"
#include "placement/balance_bound.h"
#include "placement/dispatch.h"
#include "placement/engine_formats.h"
#include "placement/node_loss.h"
#include "placement/svg.h"

namespace ucpkit::placement {
namespace {

std::string fixed(double v, int digits = 4) {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

// Sum of layer means / sum of layer maxima of GPU loads.
double overall_balancedness(const std::vector<LayerPlacement>& layers, const LoadMatrix& loads, const Cluster& cl) {
  double mean = 0, mx = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    auto g = gpu_loads(layers[l].phy2log, loads.layer_vector(l), cl);
    double sum = 0, m = 0;
    for (double x : g) sum += x, m = std::max(m, x);
    mean += sum / static_cast<double>(g.size());
    mx += m;
  }
  return mx > 0 ? mean / mx : 1.0;
}

// --dispatch: per layer the load-aware token shares (dispatch.h) and the balancedness they reach,
// beside the equal-share balancedness of the same placement.
nlohmann::json dispatch_report(const Plan& plan, const LoadMatrix& loads) {
  nlohmann::json layers = nlohmann::json::array();
  double mean = 0, mx = 0, worst = 1;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    DispatchPlan d = dispatch_plan(plan.layers[l].phy2log, loads.layer_vector(l), plan.cluster);
    mean += d.mean_load, mx += d.max_load, worst = std::min(worst, d.balancedness);
    layers.push_back({{"share", d.share},
                      {"gpu_loads", d.gpu_loads},
                      {"max_gpu_load", d.max_load},
                      {"balancedness", d.balancedness},
                      {"equal_share_balancedness", plan.layer_metrics[l].balancedness}});
  }
  return {{"method", "min-max GPU load over all splits of each expert's tokens among its replicas (max-flow)"},
          {"balancedness", mx > 0 ? mean / mx : 1.0},
          {"min_balancedness", worst},
          {"equal_share_balancedness", plan.metrics.balancedness},
          {"layers", layers}};
}

std::string dispatch_line(const nlohmann::json& d) {
  return "dispatch plan: balancedness " + fixed(d["balancedness"].get<double>()) + " (min " +
         fixed(d["min_balancedness"].get<double>()) + "); equal shares " +
         fixed(d["equal_share_balancedness"].get<double>()) + "\n";
}

nlohmann::json dispatch_summary(const nlohmann::json& d) {
  return {{"balancedness", d["balancedness"]},
          {"min_balancedness", d["min_balancedness"]},
          {"equal_share_balancedness", d["equal_share_balancedness"]}};
}

std::string render_table(const Plan& plan, const std::optional<Migration>& mig, size_t layers_shown) {
  std::ostringstream o;
  o << plan.algorithm << " on " << plan.cluster.describe() << ", " << plan.layers.size() << " layers x " << plan.experts
    << " experts, " << survives_text(plan.fault_tolerance) << " (f=" << plan.fault_tolerance << ")\n";
  o << "layer  balancedness";
  for (const auto& r : plan.metrics.recovery) o << "   p(" << r.failed_nodes << " fail)";
  o << "\n";
  auto row = [&](const std::string& name, double b, const std::vector<RecoveryEstimate>& rec) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%-6s %12s", name.c_str(), fixed(b).c_str());
    o << buf;
    for (const auto& r : rec) {
      std::snprintf(buf, sizeof buf, "  %9s%s", fixed(r.probability).c_str(), r.exact ? " " : "*");
      o << buf;
    }
    o << "\n";
  };
  for (size_t l = 0; l < plan.layer_metrics.size() && l < layers_shown; ++l)
    row(std::to_string(l), plan.layer_metrics[l].balancedness, plan.layer_metrics[l].recovery);
  if (plan.layer_metrics.size() > layers_shown)
    o << "...    (" << plan.layer_metrics.size() - layers_shown << " more layers in the plan)\n";
  row("all", plan.metrics.balancedness, plan.metrics.recovery);
  o << "min balancedness " << fixed(plan.metrics.min_balancedness);
  bool mc = false;
  for (const auto& r : plan.metrics.recovery) mc = mc || !r.exact;
  if (mc)
    o << "; * Monte Carlo, " << plan.recovery_options.mc_samples << " samples, seed " << plan.recovery_options.seed;
  o << "\n";
  if (mig) {
    o << "migration: " << mig->replicas_moved << " replicas to fetch";
    if (!mig->lost.empty())
      o << ", " << mig->lost.size() << " experts have no surviving replica (restore from checkpoint)";
    o << "\n";
  }
  return o.str();
}

// One row's name (left in `width` columns), overall balancedness and p(k) (`*`: Monte Carlo).
std::string metrics_cells(const std::string& name, int width, const Plan& p) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%-*s %12s", width, name.c_str(), fixed(p.metrics.balancedness).c_str());
  std::string row = buf;
  for (const auto& r : p.metrics.recovery) {
    std::snprintf(buf, sizeof buf, "  %6s%s", fixed(r.probability).c_str(), r.exact ? " " : "*");
    row += buf;
  }
  return row;
}

nlohmann::json recovery_summary(const std::vector<RecoveryEstimate>& rec) {
  nlohmann::json o = nlohmann::json::object();
  for (const auto& r : rec) o[std::to_string(r.failed_nodes)] = r.probability;
  return o;
}

// The `--json` summary's keys every plan has (a replace adds "replacement", a migration its counts).
nlohmann::json plan_summary(const Plan& plan, double seconds) {
  return {{"algorithm", plan.algorithm},
          {"nodes", plan.cluster.nodes},
          {"gpus_per_node", plan.cluster.gpus_per_node},
          {"slots_per_gpu", plan.cluster.slots_per_gpu},
          {"layers", plan.layers.size()},
          {"experts", plan.experts},
          {"fault_tolerance", plan.fault_tolerance},
          {"survives_node_failures", plan.fault_tolerance - 1},
          {"metrics",
           {{"balancedness", plan.metrics.balancedness},
            {"min_balancedness", plan.metrics.min_balancedness},
            {"recovery_probability", recovery_summary(plan.metrics.recovery)}}},
          {"seconds", seconds}};
}

}  // namespace

std::vector<int> parse_id_list(const std::string& text, const std::string& option) {
  std::vector<int> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(item, &used);
    } catch (...) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0)
      throw UsageError(option + " expects non-negative node ids separated by commas, got \"" + text + "\"");
    ids.push_back(v);
  }
  if (ids.empty()) throw UsageError(option + " lists no node");
  return ids;
}

Plan plan_placement(const LoadMatrix& loads, const Cluster& cluster, const std::string& algorithm,
                    const PlacementOptions& options) {
  validate_cluster(cluster);
  if (options.fault_tolerance < 1) throw UsageError(fault_tolerance_option(options.fault_tolerance) + " is impossible");
  auto algo = make_algorithm(algorithm);
  PlacementResult placed = algo->place(loads, cluster, options);
  Plan plan;
  plan.cluster = cluster;
  plan.algorithm = algo->name();
  plan.experts = static_cast<int>(loads.experts);
  plan.fault_tolerance = options.fault_tolerance;
  plan.layers = std::move(placed.layers);
  plan.details = std::move(placed.details);
  plan.node_ids.resize(cluster.nodes);
  for (int i = 0; i < cluster.nodes; ++i) plan.node_ids[i] = i;
  for (const auto& l : plan.layers) check_placement(l, cluster, plan.experts, plan.algorithm);
  // What the placement guarantees: every expert survives fewer than f failed nodes iff it sits on at
  // least f distinct nodes. eplb, eplb-global and hecate ignore f, and compact may put an expert's
  // replicas on one node; the plan records the guarantee that holds, and the request beside it.
  int guaranteed = guaranteed_fault_tolerance(plan);
  if (guaranteed < options.fault_tolerance) {
    plan.fault_tolerance = guaranteed;
    plan.details["fault_tolerance_requested"] = options.fault_tolerance;
    plan.details["survives_node_failures_requested"] = options.fault_tolerance - 1;
  }
  return plan;
}

namespace {

void add_pareto_report(const PlanRequest& req, const PlacementOptions& placement, const LoadMatrix& loads,
                       const Cluster& cluster, const std::vector<std::vector<int>>* before, PlanOutcome& out);
void add_bound_report(const LoadMatrix& loads, PlanOutcome& out);
void add_front_report(const PlanRequest& req, const PlacementOptions& placement, const LoadMatrix& loads,
                      const Cluster& cluster, const std::vector<std::vector<int>>* before, PlanOutcome& out);

// --recovery-weight is balanced-ft's, for a fresh plan or a node change (not --previous, whose moves
// are balanced-ft's local search); --pareto prints the front of it.
void check_recovery_weight(const PlanRequest& req) {
  const double w = req.placement.recovery_weight;
  if (!(w >= 0 && w <= 1)) {
    std::ostringstream got;
    got << w;
    throw UsageError("--recovery-weight must be a number from 0 to 1, got " + got.str());
  }
  if (w > 0 && req.algorithm != "balanced-ft")
    throw UsageError("--recovery-weight applies to balanced-ft, not --algorithm " + req.algorithm);
  if (w > 0 && !req.previous_path.empty())
    throw UsageError("--recovery-weight does not apply to --previous (its moves keep balanced-ft's recovery)");
  if (w > 0 && req.node_loss_migration)
    throw UsageError(
        "--recovery-weight does not apply to --current with --migration-weight or --max-moved-bytes "
        "(those moves keep balanced-ft's recovery); without them the new plan is placed with it");
  if (req.pareto && !req.report) throw UsageError("--pareto needs --report");
  if (!req.min_recovery) return;
  if (w > 0) throw UsageError("--min-recovery and --recovery-weight are exclusive: --min-recovery chooses the weight");
  if (req.algorithm != "balanced-ft")
    throw UsageError("--min-recovery applies to balanced-ft, not --algorithm " + req.algorithm);
  if (!req.previous_path.empty() || req.node_loss_migration)
    throw UsageError(
        "--min-recovery does not apply to --previous, nor to --current with --migration-weight or "
        "--max-moved-bytes (those moves keep balanced-ft's recovery)");
}

// --min-recovery k:p: popt.recovery_weight becomes the smallest weight meeting it (min_recovery.h);
// returns the choice for the summary ("min_recovery") and its line for the table.
std::pair<nlohmann::json, std::string> choose_min_recovery(const PlanRequest& req, const LoadMatrix& loads,
                                                           const Cluster& target, PlacementOptions& popt) {
  const MinRecovery& m = *req.min_recovery;
  if (m.k > target.nodes - 1)
    throw UsageError("--min-recovery " + std::to_string(m.k) + ":...: k must be below the " +
                     std::to_string(target.nodes) + " nodes");
  popt.recovery.max_failures = std::max(popt.recovery.max_failures, m.k);
  const auto achieved = [&](double w) {
    PlacementOptions wo = popt;
    wo.recovery_weight = w;
    Plan p = plan_placement(loads, target, "balanced-ft", wo);
    compute_metrics(p, loads, wo.recovery);
    return p.metrics.recovery.at(static_cast<size_t>(m.k) - 1).probability;
  };
  const MinRecoveryChoice c = smallest_recovery_weight(m, achieved);
  popt.recovery_weight = c.weight;
  nlohmann::json j = {{"failed_nodes", m.k},
                      {"target", m.p},
                      {"recovery_weight", c.weight},
                      {"achieved", c.achieved},
                      {"plans_evaluated", c.evaluations}};
  return {std::move(j), "--min-recovery " + std::to_string(m.k) + ":" + fixed(m.p, 4) + ": recovery weight " +
                            fixed(c.weight, 4) + " gives P(" + std::to_string(m.k) + " nodes down) " +
                            fixed(c.achieved, 4) + " (" + std::to_string(c.evaluations) + " plans evaluated)\n"};
}

// GPU loads of `base` (every GPU under its physical node id) for `loads`, summed over layers.
GpuChart chart_under(const Plan& base, const LoadMatrix& loads) {
  GpuChart chart;
  chart.node_ids = base.node_ids;
  chart.gpus_per_node = base.cluster.gpus_per_node;
  chart.loads.assign(base.cluster.gpus(), 0.0);
  for (size_t l = 0; l < loads.layers; ++l) {
    auto g = gpu_loads(base.layers[l].phy2log, loads.layer_vector(l), base.cluster);
    for (size_t i = 0; i < g.size(); ++i) chart.loads[i] += g[i];
  }
  return chart;
}

// --svg-layer names a layer of the loads (checked before any planning).
void check_svg_layer(const PlanRequest& req, const LoadMatrix& loads) {
  if (req.want_svg && (req.svg_layer < 0 || static_cast<size_t>(req.svg_layer) >= loads.layers))
    throw UsageError("--svg-layer " + std::to_string(req.svg_layer) + " is out of range: the loads have " +
                     std::to_string(loads.layers) + " layer(s), 0.." + std::to_string(loads.layers - 1));
}

// --previous: re-place for new loads on the previous plan's cluster, counting migration.
PlanOutcome replace_plan(const PlanRequest& req, const LoadMatrix& loads, std::chrono::steady_clock::time_point t0) {
  if (!req.current_path.empty()) throw UsageError("--previous and --current are exclusive");
  if (req.algorithm != "balanced-ft")
    throw UsageError("--previous re-places with balanced-ft's moves; --algorithm " + req.algorithm + " does not apply");
  if (req.max_moved_bytes >= 0 && req.expert_bytes <= 0)
    throw UsageError("--max-moved-bytes needs --expert-bytes (bytes of one expert copy)");
  if (req.migration_weight < 0 || !std::isfinite(req.migration_weight))
    throw UsageError("--migration-weight must be a finite number >= 0");
  Plan prev = read_plan(req.previous_path);
  const ResolvedCluster sized = resolve_cluster(req.sizes, {&prev, "--previous", req.previous_path});
  const Cluster& cc = prev.cluster;
  if (prev.layers.size() != loads.layers || prev.experts != static_cast<int>(loads.experts))
    throw Error(req.previous_path + ": plan has " + std::to_string(prev.layers.size()) + " layers x " +
                std::to_string(prev.experts) + " experts, loads have " + std::to_string(loads.layers) + " x " +
                std::to_string(loads.experts));
  PlacementOptions popt = req.placement;
  popt.fault_tolerance = sized.fault_tolerance;
  if (popt.fault_tolerance > cc.nodes || static_cast<long long>(popt.fault_tolerance) * prev.experts > cc.slots())
    throw UsageError(fault_tolerance_option(popt.fault_tolerance) + " is impossible on " + cc.describe() + " with " +
                     std::to_string(prev.experts) + " experts (each on " + std::to_string(popt.fault_tolerance) +
                     " distinct nodes)");
  std::vector<std::vector<int>> before;
  for (const auto& l : prev.layers) {
    for (int e : l.phy2log)
      if (e < 0 || e >= prev.experts) throw Error(req.previous_path + ": phy2log names an unknown expert");
    before.push_back(l.phy2log);
  }
  ReplaceOptions ro;
  ro.fault_tolerance = popt.fault_tolerance;
  ro.expert_bytes = req.expert_bytes;
  ro.max_moved_bytes = req.max_moved_bytes;
  ro.migration_weight = req.migration_weight;
  PlanOutcome out;
  out.said = sized.said;
  out.replacement = replace_with_migration(before, loads, cc, ro);
  out.plan.cluster = cc;
  out.plan.algorithm = "balanced-ft";
  out.plan.experts = prev.experts;
  out.plan.fault_tolerance = popt.fault_tolerance;
  out.plan.layers = out.replacement->layers;
  out.plan.node_ids = prev.node_ids;
  out.plan.details["replaced_from"] = req.previous_path;
  int guaranteed = guaranteed_fault_tolerance(out.plan);
  if (guaranteed < popt.fault_tolerance) throw Error("internal: re-placement lost the fault-tolerance guarantee");
  const auto& rr = *out.replacement;
  if (req.max_moved_bytes >= 0 && req.expert_bytes * static_cast<double>(rr.mandatory_copies) > req.max_moved_bytes)
    out.notes.push_back("keeping " + fault_tolerance_option(popt.fault_tolerance) + " needs " +
                        std::to_string(rr.mandatory_copies) + " copies, more than --max-moved-bytes allows");
  compute_metrics(out.plan, loads, popt.recovery);
  // The same loads placed from scratch, for comparison: what a plain re-run would move. Above
  // kLargeClusterNodes eplb-global is placed for it only with --report (at 1,024 nodes its placement was
  // about a tenth of the run, for a comparison field), and so is balanced-ft where the re-placement
  // placed it only for the layers whose search stalled (a migration weight or budget): the plan says
  // so in "from_scratch_skipped".
  nlohmann::json scratch = nlohmann::json::object();
  nlohmann::json skipped = nlohmann::json::object();
  double prev_bal = overall_balancedness(prev.layers, loads, cc);
  const bool large_compared = cc.nodes <= kLargeClusterNodes || req.report;
  const std::string above = "not placed above " + std::to_string(kLargeClusterNodes) + " nodes without --report";
  if (!large_compared) skipped["eplb-global"] = above;
  if (!large_compared && rr.from_scratch.size() != loads.layers)
    skipped["balanced-ft"] = above + " (with a migration weight or budget: placed only where the moves stall)";
  for (const char* algo : {"eplb-global", "balanced-ft"}) {
    if (skipped.contains(algo)) continue;
    // balanced-ft from scratch was placed by the re-placement already (one of its options).
    const bool reuse = std::string(algo) == "balanced-ft" && rr.from_scratch.size() == loads.layers;
    std::vector<LayerPlacement> placed;  // referenced, not copied: 64 layers of phy2log at 1,024 nodes
    if (!reuse) placed = plan_placement(loads, cc, algo, popt).layers;
    const std::vector<LayerPlacement>& fresh = reuse ? rr.from_scratch : placed;
    long long copies = 0;
    for (size_t l = 0; l < loads.layers; ++l) copies += copies_between(before[l], fresh[l].phy2log, cc);
    nlohmann::json j = {{"balancedness", overall_balancedness(fresh, loads, cc)}, {"copies_moved", copies}};
    if (req.expert_bytes > 0) j["bytes_moved"] = req.expert_bytes * static_cast<double>(copies);
    scratch[algo] = j;
  }
  nlohmann::json rep = replace_to_json(rr, req.expert_bytes);
  rep["previous_balancedness"] = prev_bal;
  rep["from_scratch"] = scratch;
  if (!skipped.empty()) rep["from_scratch_skipped"] = skipped;
  nlohmann::json rextra = {{"replacement", rep}};
  if (req.dispatch) rextra["dispatch"] = dispatch_report(out.plan, loads);
  out.file_extra = rextra;
  std::ostringstream extra;
  extra << "re-placement from " << req.previous_path << ": balancedness " << fixed(prev_bal)
        << " (previous plan, new loads) -> " << fixed(out.plan.metrics.balancedness) << ", " << rr.copies
        << " expert copies moved";
  if (req.expert_bytes > 0) extra << " (" << req.expert_bytes * static_cast<double>(rr.copies) << " bytes)";
  extra << " in " << rr.rounds << " rounds (lower bound " << rr.round_lower_bound << ")\n";
  for (const auto& [name, j] : scratch.items())
    extra << "  from scratch, " << name << ": balancedness " << fixed(j["balancedness"].get<double>()) << ", "
          << j["copies_moved"].get<long long>() << " copies\n";
  for (const auto& [name, j] : skipped.items())
    extra << "  from scratch, " << name << ": not placed above " << kLargeClusterNodes
          << " nodes (--report places it)\n";
  out.table = render_table(out.plan, std::nullopt, 32) + extra.str();
  if (req.dispatch) out.table += dispatch_line(rextra["dispatch"]);
  if (req.want_svg) out.svg = plan_svg(out.plan, chart_under(prev, loads), "before: previous plan", req.svg_layer);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json summary_rep = rep;
  summary_rep.erase("transfers");
  out.summary = plan_summary(out.plan, out.seconds);  // out.plan.cluster is cc
  out.summary["replacement"] = summary_rep;
  if (!sized.from_plan.empty()) out.summary["from_plan"] = sized.from_plan;
  if (req.dispatch) out.summary["dispatch"] = dispatch_summary(rextra["dispatch"]);
  if (!out.notes.empty()) out.summary["notes"] = out.notes;
  if (req.report) {
    add_pareto_report(req, popt, loads, cc, &before, out);
    add_bound_report(loads, out);
  }
  if (req.pareto) add_front_report(req, popt, loads, cc, &before, out);
  return out;
}

// --current --failed-nodes with --migration-weight / --max-moved-bytes: the survivors' placement is
// the start, the migration model of --previous decides how far to move (node_loss.h). The plan keeps
// "migration" (node fetches, physical ids, as without the options) and adds "replacement" (GPU copies
// in rounds, each naming its surviving source GPU and node).
PlanOutcome node_loss_plan(const PlanRequest& req, const LoadMatrix& loads, const Plan& current,
                           const std::vector<int>& physical, const Cluster& target, const PlacementOptions& popt,
                           PlanOutcome out, std::chrono::steady_clock::time_point t0) {
  if (req.change.added > 0 || req.change.failed.empty())
    throw UsageError("--migration-weight and --max-moved-bytes with --current apply to --failed-nodes");
  if (req.algorithm != "balanced-ft")
    throw UsageError(
        "--current with --migration-weight or --max-moved-bytes re-places with balanced-ft's moves; "
        "--algorithm " +
        req.algorithm + " does not apply");
  if (req.max_moved_bytes >= 0 && req.expert_bytes <= 0)
    throw UsageError("--max-moved-bytes needs --expert-bytes (bytes of one expert copy)");
  if (req.migration_weight < 0 || !std::isfinite(req.migration_weight))
    throw UsageError("--migration-weight must be a finite number >= 0");
  ReplaceOptions ro;
  ro.fault_tolerance = popt.fault_tolerance;
  ro.expert_bytes = req.expert_bytes;
  ro.max_moved_bytes = req.max_moved_bytes;
  ro.migration_weight = req.migration_weight;
  NodeLossResult nl = replace_after_node_loss(current, physical, loads, target, ro, out.plan);
  out.plan.algorithm = "balanced-ft";
  out.plan.details["replaced_from"] = req.current_path;
  if (guaranteed_fault_tolerance(out.plan) < popt.fault_tolerance)
    throw Error("internal: node-loss re-placement lost the fault-tolerance guarantee");
  out.replacement = std::move(nl.replacement);
  out.migration = std::move(nl.fetches);
  const ReplaceResult& rr = *out.replacement;
  compute_metrics(out.plan, loads, popt.recovery);
  // What --current without the options does: balanced-ft from scratch (placed by the re-placement
  // already), its nodes matched onto the survivors. Above 256 nodes with a weight > 0 or a budget the
  // re-placement has no from-scratch option (replace.cpp) and the plan no such comparison.
  const bool compared = rr.from_scratch.size() == loads.layers;
  long long scratch_fetches = 0;
  double scratch_bal = 0;
  if (compared) {
    Plan scratch = out.plan;
    scratch.layers = rr.from_scratch;
    scratch_fetches = migrate(current, scratch, physical).replicas_moved;
    scratch_bal = overall_balancedness(rr.from_scratch, loads, target);
  }
  nlohmann::json rep = replace_to_json(rr, req.expert_bytes);
  if (compared)
    rep["from_scratch"] = {{"balanced-ft", {{"balancedness", scratch_bal}, {"replicas_moved", scratch_fetches}}}};
  nlohmann::json extra = {{"migration", migration_to_json(*out.migration, req.expert_bytes)}, {"replacement", rep}};
  if (req.dispatch) extra["dispatch"] = dispatch_report(out.plan, loads);
  out.file_extra = extra;
  out.transfer_node_ids = physical;
  out.transfers_with_nodes = true;
  std::ostringstream o;
  o << "node-loss re-placement: " << rr.copies << " GPU copies (" << rr.mandatory_copies
    << " to keep the fault tolerance) in " << rr.rounds << " rounds (lower bound " << rr.round_lower_bound << ")\n";
  if (compared)
    o << "  from scratch, balanced-ft (--current without --migration-weight): balancedness " << fixed(scratch_bal)
      << ", " << scratch_fetches << " replicas to fetch\n";
  out.table = render_table(out.plan, out.migration, 32) + o.str();
  if (req.dispatch) out.table += dispatch_line(extra["dispatch"]);
  if (req.want_svg) out.svg = plan_svg(out.plan, chart_under(current, loads), "before: current plan", req.svg_layer);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json summary_rep = rep;
  summary_rep.erase("transfers");
  out.summary = plan_summary(out.plan, out.seconds);
  out.summary["replicas_moved"] = out.migration->replicas_moved;
  out.summary["recoverable"] = out.migration->lost.empty();
  out.summary["node_ids"] = out.migration->node_ids;
  if (req.expert_bytes > 0)
    out.summary["bytes_moved"] = req.expert_bytes * static_cast<double>(out.migration->replicas_moved);
  out.summary["replacement"] = summary_rep;
  if (!out.notes.empty()) out.summary["notes"] = out.notes;
  if (req.dispatch) out.summary["dispatch"] = dispatch_summary(extra["dispatch"]);
  if (req.report) add_pareto_report(req, popt, loads, target, nullptr, out);
  return out;
}

// --report: every registered algorithm on the same loads and cluster: balancedness, recovery for
// k = 1..f+1, copies (and bytes) from the previous plan when there is one, and run time.
void add_pareto_report(const PlanRequest& req, const PlacementOptions& placement, const LoadMatrix& loads,
                       const Cluster& cluster, const std::vector<std::vector<int>>* before, PlanOutcome& out) {
  PlacementOptions popt = placement;
  popt.recovery.max_failures = std::min(popt.fault_tolerance + 1, cluster.nodes - 1);
  nlohmann::json rows = nlohmann::json::array();
  std::ostringstream o;
  o << "\nPareto table (same loads and cluster; p(k) for k = 1.." << popt.recovery.max_failures << ")\n";
  o << "algorithm        balancedness";
  for (int k = 1; k <= popt.recovery.max_failures; ++k) o << "    p(" << k << ")";
  if (before) o << "   copies";
  o << "   seconds\n";
  for (const auto& name : algorithm_names()) {
    auto t0 = std::chrono::steady_clock::now();
    nlohmann::json row = {{"algorithm", name}};
    try {
      Plan p = plan_placement(loads, cluster, name, popt);
      compute_metrics(p, loads, popt.recovery);
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      row["balancedness"] = p.metrics.balancedness;
      row["fault_tolerance"] = p.fault_tolerance;
      row["recovery_probability"] = recovery_summary(p.metrics.recovery);
      row["seconds"] = secs;
      char buf[64];
      o << metrics_cells(name, 16, p);
      if (before) {
        long long copies = 0;
        for (size_t l = 0; l < loads.layers; ++l) copies += copies_between((*before)[l], p.layers[l].phy2log, cluster);
        row["copies_moved"] = copies;
        if (req.expert_bytes > 0) row["bytes_moved"] = req.expert_bytes * static_cast<double>(copies);
        std::snprintf(buf, sizeof buf, " %8lld", copies);
        o << buf;
      }
      std::snprintf(buf, sizeof buf, "  %8.4f\n", secs);
      o << buf;
    } catch (const UsageError& e) {
      row["error"] = e.what();
      o << name << ": " << e.what() << "\n";
    }
    rows.push_back(row);
  }
  if (before && out.replacement) {
    o << "re-placement (--previous): balancedness " << fixed(out.plan.metrics.balancedness) << ", "
      << out.replacement->copies << " copies\n";
  }
  out.table += o.str();
  out.summary["pareto"] = rows;
}

// --report: per layer the gap between the plan's balancedness and the proven upper bound on the
// balancedness of any placement meeting the plan's f (balance_bound.h): gap = 1 - balancedness /
// bound; 0 means the plan is optimal for that layer.
void add_bound_report(const LoadMatrix& loads, PlanOutcome& out) {
  const Plan& plan = out.plan;
  nlohmann::json layers = nlohmann::json::array();
  std::ostringstream o;
  o << "\nGap to the balance bound under f=" << plan.fault_tolerance
    << " (no placement meeting f balances better than the bound; gap = 1 - balancedness / bound)\n";
  o << "layer  balancedness       bound      gap\n";
  double worst = 0, sum = 0;
  int optimal = 0;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const auto t = loads.layer_vector(l);
    const double b = plan.layer_metrics[l].balancedness;
    const FtBalanceBound bound = ft_balance_bound(t, plan.cluster, plan.fault_tolerance);
    const double gap = std::max(0.0, 1 - b / bound.balancedness);
    worst = std::max(worst, gap);
    sum += gap;
    optimal += gap <= 1e-9;
    layers.push_back({{"layer", l}, {"balancedness", b}, {"bound", bound.balancedness}, {"gap", gap}});
    if (l < 32) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "%-6zu %12s %11s %8s%s\n", l, fixed(b).c_str(), fixed(bound.balancedness).c_str(),
                    fixed(gap).c_str(), gap <= 1e-9 ? "  optimal" : "");
      o << buf;
    }
  }
  if (plan.layers.size() > 32) o << "...    (" << plan.layers.size() - 32 << " more layers in the --json summary)\n";
  const double mean = plan.layers.empty() ? 0 : sum / static_cast<double>(plan.layers.size());
  o << "gap: worst " << fixed(worst) << ", mean " << fixed(mean) << "; " << optimal << " of " << plan.layers.size()
    << " layers at the bound (optimal)\n";
  out.table += o.str();
  out.summary["balance_bound"] = {{"fault_tolerance", plan.fault_tolerance},
                                  {"worst_gap", worst},
                                  {"mean_gap", mean},
                                  {"optimal_layers", optimal},
                                  {"layers", layers}};
}

// --report --pareto: balanced-ft for several --recovery-weight values, beside lazarus: overall
// balancedness, p(k) for k = 1..f+1, and the expert copies (bytes with --expert-bytes) from --previous,
// else from the w = 0 plan (what switching from the default plan to that point moves).
void add_front_report(const PlanRequest& req, const PlacementOptions& placement, const LoadMatrix& loads,
                      const Cluster& cluster, const std::vector<std::vector<int>>* before, PlanOutcome& out) {
  PlacementOptions popt = placement;
  popt.recovery.max_failures = std::min(popt.fault_tolerance + 1, cluster.nodes - 1);
  const int f = popt.fault_tolerance;
  std::ostringstream o;
  o << "\nBalance/recovery front (balanced-ft --recovery-weight w; free: per layer the most recoverable candidate no less balanced than w = 0; lazarus; f="
    << f << "; copies from " << (before ? "--previous" : "the w = 0 plan") << ")\n";
  o << "point                balancedness";
  for (int k = 1; k <= popt.recovery.max_failures; ++k) o << "    p(" << k << ")";
  o << "   copies" << (req.expert_bytes > 0 ? "        bytes" : "") << "\n";
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<int>> base;
  const double weights[] = {0, -2, 0.25, 0.5, 0.75, 1, -1};  // -1: lazarus, -2: "free" (PlacementOptions)
  for (double w : weights) {
    PlacementOptions wo = popt;
    wo.recovery_weight = std::max(0.0, w);
    wo.recovery_free = w == -2;
    Plan p = plan_placement(loads, cluster, w == -1 ? "lazarus" : "balanced-ft", wo);
    compute_metrics(p, loads, wo.recovery);
    if (w == 0)
      for (const auto& l : p.layers) base.push_back(l.phy2log);
    long long copies = 0;
    const auto& from = before ? *before : base;
    for (size_t l = 0; l < loads.layers; ++l) copies += copies_between(from[l], p.layers[l].phy2log, cluster);
    const std::string name = w == -1 ? "lazarus" : w == -2 ? "free" : "w=" + fixed(w, 2);
    nlohmann::json row = {{"point", name},
                          {"balancedness", p.metrics.balancedness},
                          {"recovery_probability", recovery_summary(p.metrics.recovery)},
                          {"copies_moved", copies}};
    if (w >= 0) row["recovery_weight"] = w;
    char buf[64];
    o << metrics_cells(name, 20, p);
    std::snprintf(buf, sizeof buf, " %8lld", copies);
    o << buf;
    if (req.expert_bytes > 0) {
      row["bytes_moved"] = req.expert_bytes * static_cast<double>(copies);
      std::snprintf(buf, sizeof buf, " %12.4g", req.expert_bytes * static_cast<double>(copies));
      o << buf;
    }
    o << "\n";
    rows.push_back(std::move(row));
  }
  out.table += o.str();
  out.summary["front"] = rows;
}

PlanOutcome make_plan_core(const PlanRequest& req) {
  auto t0 = std::chrono::steady_clock::now();
  check_recovery_weight(req);
  if (req.current_path.empty() && req.previous_path.empty()) resolve_cluster(req.sizes);  // sizes before the loads
  LoadMatrix loads = read_loads(req.loads_path, req.load_options);
  if (req.layers_map) loads = moe_rows(loads, *req.layers_map, req.loads_path);
  check_svg_layer(req, loads);

  if (!req.previous_path.empty()) return replace_plan(req, loads, t0);
  std::optional<Plan> current;
  if (!req.current_path.empty()) current = read_plan(req.current_path);
  const ResolvedCluster sized = current ? resolve_cluster(req.sizes, {&*current, "--current", req.current_path})
                                        : resolve_cluster(req.sizes);
  Cluster target = sized.cluster;
  std::vector<int> physical;
  if (current) {
    if (current->layers.size() != loads.layers)
      throw Error(req.current_path + ": plan has " + std::to_string(current->layers.size()) + " layers, loads have " +
                  std::to_string(loads.layers));
    if (current->experts > static_cast<int>(loads.experts))
      throw Error(req.current_path + ": plan places expert ids beyond the " + std::to_string(loads.experts) +
                  " experts of the loads");
    physical = nodes_after_change(*current, req.change);
    target.nodes = static_cast<int>(physical.size());
  } else if (!req.change.failed.empty() || req.change.added > 0) {
    throw UsageError("--failed-nodes and --added-nodes need --current");
  }

  PlanOutcome out;
  out.said = sized.said;
  PlacementOptions popt = req.placement;
  popt.fault_tolerance = sized.fault_tolerance;
  if (current) {
    // After failures there may be too few slots for f replicas each; Lazarus then lowers f.
    long long fit = std::min<long long>(target.nodes, target.slots() / static_cast<long long>(loads.experts));
    if (fit >= 1 && popt.fault_tolerance > fit) {
      out.notes.push_back("fault tolerance lowered from " + fault_tolerance_option(popt.fault_tolerance) + " to " +
                          fault_tolerance_option(static_cast<int>(fit)) + ": not enough slots left");
      popt.fault_tolerance = static_cast<int>(fit);
    }
  }
  if (current && req.node_loss_migration) {
    PlanOutcome nl = node_loss_plan(req, loads, *current, physical, target, popt, std::move(out), t0);
    if (!sized.from_plan.empty()) nl.summary["from_plan"] = sized.from_plan;
    return nl;
  }
  std::pair<nlohmann::json, std::string> min_recovery;
  if (req.min_recovery) min_recovery = choose_min_recovery(req, loads, target, popt);
  out.plan = plan_placement(loads, target, req.algorithm, popt);
  if (out.plan.details.contains("fault_tolerance_requested"))
    out.notes.push_back(out.plan.algorithm + " does not guarantee " + fault_tolerance_option(popt.fault_tolerance) +
                        ": some expert sits on only " + std::to_string(out.plan.fault_tolerance) +
                        " node(s), so the plan " + survives_text(out.plan.fault_tolerance) +
                        " (records fault_tolerance " + std::to_string(out.plan.fault_tolerance) + ")");
  if (current) out.migration = migrate(*current, out.plan, physical);
  compute_metrics(out.plan, loads, popt.recovery);
  nlohmann::json extra = nlohmann::json::object();
  if (out.migration) extra["migration"] = migration_to_json(*out.migration, req.expert_bytes);
  if (req.dispatch) extra["dispatch"] = dispatch_report(out.plan, loads);
  out.file_extra = extra;
  out.table = render_table(out.plan, out.migration, 32);
  if (req.dispatch) out.table += dispatch_line(extra["dispatch"]);
  out.table += min_recovery.second;

  if (req.want_svg) {
    // Before: every GPU of the current plan under its physical node id (failed nodes included), or
    // the spread baseline on the same nodes for a fresh plan.
    if (current) {
      out.svg = plan_svg(out.plan, chart_under(*current, loads), "before: current plan", req.svg_layer);
    } else {
      Plan spread = plan_placement(loads, target, "spread", popt);
      out.svg = plan_svg(out.plan, chart_under(spread, loads), "before: spread baseline", req.svg_layer);
    }
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  nlohmann::json s = plan_summary(out.plan, out.seconds);
  if (out.migration) {
    s["replicas_moved"] = out.migration->replicas_moved;
    s["recoverable"] = out.migration->lost.empty();
    s["node_ids"] = out.migration->node_ids;
    if (req.expert_bytes > 0) s["bytes_moved"] = req.expert_bytes * static_cast<double>(out.migration->replicas_moved);
  }
  if (out.plan.details.contains("fault_tolerance_requested")) {
    s["fault_tolerance_requested"] = out.plan.details["fault_tolerance_requested"];
    s["survives_node_failures_requested"] = out.plan.details["survives_node_failures_requested"];
  }
  if (!sized.from_plan.empty()) s["from_plan"] = sized.from_plan;
  if (!out.notes.empty()) s["notes"] = out.notes;
  if (req.dispatch) s["dispatch"] = dispatch_summary(extra["dispatch"]);
  if (req.min_recovery) s["min_recovery"] = min_recovery.first;
  out.summary = std::move(s);
  if (req.report) {
    add_pareto_report(req, popt, loads, target, nullptr, out);
    add_bound_report(loads, out);
  }
  if (req.pareto) add_front_report(req, popt, loads, target, nullptr, out);
  return out;
}

}  // namespace

void PlanOutcome::write_plan_file(const TextSink& sink) const {
  if (!replacement) {
    write_plan_json(plan, file_extra, {}, sink);
    return;
  }
  write_plan_json(plan, file_extra,
                  {{nlohmann::json(kTransfersPlaceholder).dump(),
                    [&](const TextSink& s) {
                      write_transfers_json(*replacement, transfers_with_nodes ? &transfer_node_ids : nullptr,
                                           plan.cluster.gpus_per_node, s);
                    }}},
                  sink);
}

std::string PlanOutcome::plan_file_text() const {
  std::string text;
  write_plan_file([&](std::string_view piece) { text.append(piece); });
  return text;
}

PlanOutcome make_plan(const PlanRequest& req) {
  PlanOutcome out = make_plan_core(req);
  if (req.want_sglang)
    out.sglang_text = sglang_expert_location_json(out.plan, req.layers_map ? &*req.layers_map : nullptr);
  if (req.layers_map)
    out.summary["layers_map"] = {{"decoder_layers", req.layers_map->decoder_layers},
                                 {"moe_layers", req.layers_map->moe_layers}};
  if (!req.pp_stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    std::ostringstream o;
    for (const PpStage& st : req.pp_stages) {
      stages.push_back({{"stage", st.stage},
                        {"decoder_layers", {st.first_layer, st.end_layer}},
                        {"moe_layers", st.moe_layers},
                        {"sglang_rows", {st.first_layer, st.end_layer}},
                        {"vllm_rows", {st.first_moe_row, st.end_moe_row}}});
      o << "pp stage " << st.stage << ": decoder layers " << st.first_layer << "-" << st.end_layer - 1
        << " (SGLang rows " << st.first_layer << ".." << st.end_layer - 1 << "), " << st.moe_layers.size()
        << " MoE layers (plan and vLLM rows " << st.first_moe_row << ".." << st.end_moe_row - 1 << ")\n";
    }
    out.summary["layers_map"]["pp_stages"] = std::move(stages);
    out.table += o.str();
  }
  if (req.want_vllm) out.vllm_bytes = vllm_eplb_state_safetensors(out.plan);
  return out;
}

}  // namespace ucpkit::placement
