// moe-replace: load-balanced, failure-tolerant expert placement and re-placement.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "placement/planner.h"
#include "tool/cli.h"
#include "tool/dry_run.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Plan which GPU holds which expert replicas: balanced load, and every expert alive after node failures",
               "moe-replace"};
  tool::CommonOptions common;
  placement::PlanRequest req;
  std::string output, svg, failed;
  int added = 0;
  double exact_limit = 1e6;
  app.add_option("--input,--loads", req.loads_path, "Expert loads: JSON [layers][experts], CSV, router trace JSONL, logical_count dump, SGLang expert-distribution .pt dump, vLLM EPLB load window .safetensors")
      ->required();
  app.add_option("--nodes", req.sizes.nodes,
                 "Nodes (required without --current/--previous; with them: the plan's nodes, default taken from it)");
  app.add_option("--gpus-per-node", req.sizes.gpus_per_node, "GPUs per node (default with --current/--previous: the plan's)");
  app.add_option("--slots-per-gpu", req.sizes.slots_per_gpu,
                 "Expert replica slots per GPU (default with --current/--previous: the plan's)");
  app.add_option("--survive-node-failures", req.sizes.survive_node_failures,
                 "K: every expert keeps a replica when any K nodes fail (each on K+1 distinct nodes; balanced-ft, "
                 "lazarus, spread; others: a warning, and the plan records what holds). Default 0, with "
                 "--current/--previous the plan's");
  app.add_option("--fault-tolerance", req.sizes.fault_tolerance,
                 "F = K+1, the older spelling of --survive-node-failures (F distinct nodes per expert; default 1)");
  app.add_option("--groups", req.placement.groups, "Expert groups (eplb: hierarchical when groups % nodes == 0)")
      ->capture_default_str();
  app.add_option("--algorithm", req.algorithm, "balanced-ft (default) | lazarus | eplb | eplb-global | spread | compact | hecate")
      ->capture_default_str();
  app.add_option("--output", output, "Plan JSON to write")->required();
  auto* cur = app.add_option("--current", req.current_path, "Current plan JSON, for re-placement");
  auto* fail_opt = app.add_option("--failed-nodes", failed, "Failed node ids, e.g. 3,7 (needs --current)");
  auto* add_opt = app.add_option("--added-nodes", added, "Number of nodes added (needs --current)");
  fail_opt->needs(cur);
  add_opt->needs(cur);
  fail_opt->excludes(add_opt);
  auto* svg_opt = app.add_option("--svg", svg, "Also draw GPU load before/after and the replica map");
  app.add_option("--svg-layer", req.svg_layer, "Layer drawn in the replica map (0 .. layers - 1)")
      ->capture_default_str()
      ->needs(svg_opt);
  app.add_option("--max-failures", req.placement.recovery.max_failures, "Recovery probability for k = 1..K failed nodes")
      ->capture_default_str();
  app.add_option("--mc-samples", req.placement.recovery.mc_samples, "Monte Carlo samples per k")->capture_default_str();
  app.add_option("--seed", req.placement.recovery.seed, "Monte Carlo seed")->capture_default_str();
  app.add_option("--exact-limit", exact_limit, "Enumerate exactly when C(N,k) <= this")->capture_default_str();
  app.add_option("--window", req.load_options.window, "Moving average over the last W load snapshots (0: all)")
      ->capture_default_str();
  app.add_option("--snapshot", req.load_options.snapshot, "Use one load snapshot by key (e.g. SmartMoE iteration)");
  app.add_option("--experts", req.load_options.experts, "Experts per layer for router traces (0: infer)");
  app.add_option("--overlap-degree", req.placement.overlap_degree, "hecate: overlap degree t (default: all experts)");
  app.add_option("--memory", req.placement.memory,
                 "hecate: memory capacity m, distinct experts materialized per GPU per layer, 1..S (default: "
                 "--slots-per-gpu; with m < S the other slots repeat experts the GPU holds)");
  uint64_t expert_bytes = 0, max_moved_bytes = 0;
  auto* expert_bytes_opt =
      tool::add_size_option(app, "--expert-bytes", expert_bytes, "Bytes per expert replica (a size: 64M), to report bytes moved");
  auto* prev_opt = app.add_option("--previous", req.previous_path,
                                  "Previous plan JSON: re-place for the new --loads on its cluster, counting the "
                                  "expert copies moved (balanced-ft moves, fault tolerance kept)");
  prev_opt->excludes(cur);
  auto* max_moved_opt = tool::add_size_option(app, "--max-moved-bytes", max_moved_bytes,
                 "With --previous or --current --failed-nodes: bytes (a size: 2G) the balance moves may copy (needs --expert-bytes; the copies that keep "
                 "the fault tolerance are made regardless)");
  auto* weight_opt = app.add_option("--migration-weight", req.migration_weight,
                 "With --previous, or --current --failed-nodes: take moves only when the imbalance removed (fraction "
                 "of total load) is at least this x the fraction of all replicas copied (0: every improving move). "
                 "With --current it (or --max-moved-bytes) starts from what survives on the nodes left and "
                 "schedules the copies in rounds")
      ->capture_default_str();
  auto* report_opt = app.add_flag("--report", req.report,
               "Also print a Pareto table: every algorithm's balancedness, recovery for k = 1..f+1, copies from "
               "--previous and run time (in the --json summary as \"pareto\"), and per layer the gap to the "
               "proven upper bound on balance under f (\"balance_bound\")");
  app.add_option("--recovery-weight", req.placement.recovery_weight,
                 "balanced-ft: 0 = the most balanced placement, 1 = the most recoverable when f nodes fail (at "
                 "least Lazarus'), between: per layer the largest (1-w) x balancedness + w x p(f), same f")
      ->capture_default_str();
  app.add_flag("--pareto", req.pareto,
               "With --report: also print balanced-ft's balance/recovery front for --recovery-weight 0, 0.25, "
               "0.5, 0.75, 1 beside lazarus (balancedness, p(k) for k = 1..f+1, copies; \"front\" in --json)")
      ->needs(report_opt);
  app.add_flag("--dispatch", req.dispatch,
               "Also compute a token dispatch plan for uneven replicas: per slot the share of its expert's tokens "
               "that balances GPU loads best (plan key \"dispatch\"; balancedness for it and for equal shares)");
  std::string sglang_out, vllm_out;
  app.add_option("--sglang-expert-location", sglang_out,
                 "Also write the plan as SGLang's --init-expert-location JSON ({\"physical_to_logical_map\"})");
  std::string layers_map;
  app.add_option("--layers-map", layers_map,
                 "The model's decoder layers and which are MoE: D:a-b[,c...] (e.g. 61:3-60 for DeepSeek-V3) or its "
                 "config.json. Loads may then have a row per decoder layer (dense rows dropped); "
                 "--sglang-expert-location gets a row per decoder layer, --vllm-eplb-state one per MoE layer");
  app.add_option("--vllm-eplb-state", vllm_out,
                 "Also write the plan as vLLM EPLB state tensors (safetensors: physical_to_logical_map, "
                 "logical_to_physical_map, logical_replica_count)");
  int threads = 0;
  bool dry_run = false, overwrite = false;
  tool::add_threads_option(app, threads);
  tool::add_dry_run_option(app, dry_run);
  tool::add_overwrite_option(app, overwrite,
                             "Accepted as in every tool; moe-replace replaces its output files anyway (whole, "
                             "atomically), as job scripts rerun it");
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  if (expert_bytes_opt->count()) req.expert_bytes = static_cast<double>(expert_bytes);
  if (max_moved_opt->count()) req.max_moved_bytes = static_cast<double>(max_moved_bytes);
  req.node_loss_migration = cur->count() && (weight_opt->count() || max_moved_opt->count());

  return tool::run("moe-replace", [&] { return tool::in_threads(threads, [&] {
    req.placement.recovery.exact_limit = exact_limit;
    // A written file never replaces the loads (or the other written file).
    auto refuse_same = [](const std::string& a, const char* a_opt, const std::string& b, const char* b_opt) {
      if (path_within(a, b) && path_within(b, a))
        throw UsageError(std::string(a_opt) + " " + a + " is " + b_opt + " " + b + ": writing it would replace the " +
                         (std::string(b_opt) == "--loads" ? "input" : "plan"));
    };
    refuse_same(output, "--output", req.loads_path, "--loads");
    if (!svg.empty()) {
      refuse_same(svg, "--svg", req.loads_path, "--loads");
      refuse_same(svg, "--svg", output, "--output");
    }
    if (req.placement.recovery.max_failures < 0) throw UsageError("--max-failures must not be negative");
    if (!failed.empty()) req.change.failed = placement::parse_id_list(failed, "--failed-nodes");
    req.change.added = added;
    req.want_svg = !svg.empty();
    req.want_sglang = !sglang_out.empty();
    req.want_vllm = !vllm_out.empty();
    if (!layers_map.empty()) req.layers_map = placement::parse_layers_map(layers_map);
    placement::PlanOutcome out = placement::make_plan(req);
    if (!out.said.empty()) tool::info(out.said);
    for (const auto& note : out.notes) tool::warn(note);
    if (out.migration && !out.migration->lost.empty())
      tool::warn(std::to_string(out.migration->lost.size()) + " experts have no surviving replica");
    // All or nothing: every output's folder is checked, and every output written to its temporary
    // file, before the first is renamed into place; a failure before that leaves none of them.
    const std::vector<std::pair<std::string, std::string_view>> files = {
        {output, out.plan_text}, {svg, out.svg}, {sglang_out, out.sglang_text}, {vllm_out, out.vllm_bytes}};
    if (dry_run) {
      std::vector<std::string> names;
      for (const auto& f : files)
        if (!f.first.empty()) names.push_back(f.first);
      if (!common.json) std::cout << out.table;
      tool::print_dry_run("moe-replace", tool::replace_dry_run(out.summary, names), common.json);
      return 0;
    }
    for (const auto& [path, bytes] : files) {
      if (path.empty()) continue;
      std::filesystem::path dir = std::filesystem::path(path).parent_path();
      if (dir.empty()) dir = ".";
      if (::access(dir.c_str(), W_OK) != 0) throw Error(path + ": folder " + dir.string() + " is not writable");
      std::error_code ec;
      if (std::filesystem::is_directory(path, ec)) throw Error(path + ": is a folder, not a file");
    }
    std::vector<std::unique_ptr<AtomicFile>> staged;
    for (const auto& [path, bytes] : files) {
      if (path.empty()) continue;
      staged.push_back(std::make_unique<AtomicFile>(path));
      staged.back()->write(bytes.data(), bytes.size());
      staged.back()->flush();
    }
    for (auto& f : staged) f->commit();
    if (common.json) {
      out.summary["output"] = output;
      if (!svg.empty()) out.summary["svg"] = svg;
      if (!sglang_out.empty()) out.summary["sglang_expert_location"] = sglang_out;
      if (!vllm_out.empty()) out.summary["vllm_eplb_state"] = vllm_out;
      out.summary["peak_rss_bytes"] = tool::peak_rss_bytes();
      tool::print_json(tool::envelope("moe-replace", output, out.summary));
    } else if (tool::verbosity() >= 0) {
      std::cout << out.table;
    }
    tool::verbose("wrote " + output + " in " + std::to_string(out.seconds) + " s");
    return 0;
  }); });
}
