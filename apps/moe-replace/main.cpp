// moe-replace: load-balanced, failure-tolerant expert placement and re-placement (options, check and
// run: lib/tool/moe_replace.h).
#include "core/allocator.h"
#include "tool/cli.h"
#include "tool/moe_replace.h"

namespace {

// Declares every option into `o`; returns the options whose presence matters beyond their value.
struct Given {
  CLI::Option *current, *expert_bytes, *max_moved, *weight;
};

Given add_options(CLI::App& app, ucpkit::tool::MoeReplaceOptions& o) {
  using namespace ucpkit;
  app.add_option("--input,--loads", o.req.loads_path, "Expert loads: JSON [layers][experts], CSV, router trace JSONL, logical_count dump, SGLang expert-distribution .pt dump, vLLM EPLB load window .safetensors")
      ->required();
  app.add_option("--nodes", o.req.sizes.nodes,
                 "Nodes (required without --current/--previous; with them: the plan's nodes, default taken from it)");
  app.add_option("--gpus-per-node", o.req.sizes.gpus_per_node, "GPUs per node (default with --current/--previous: the plan's)");
  app.add_option("--slots-per-gpu", o.req.sizes.slots_per_gpu,
                 "Expert replica slots per GPU (default with --current/--previous: the plan's)");
  app.add_option("--survive-node-failures", o.req.sizes.survive_node_failures,
                 "K: every expert keeps a replica when any K nodes fail (each on K+1 distinct nodes; balanced-ft, "
                 "lazarus, spread; others: a warning, and the plan records what holds). Default 0, with "
                 "--current/--previous the plan's");
  app.add_option("--fault-tolerance", o.req.sizes.fault_tolerance,
                 "F = K+1, the older spelling of --survive-node-failures (F distinct nodes per expert; default 1)");
  app.add_option("--groups", o.req.placement.groups, "Expert groups (eplb: hierarchical when groups % nodes == 0)")
      ->capture_default_str();
  app.add_option("--algorithm", o.req.algorithm, "balanced-ft (default) | lazarus | eplb | eplb-global | spread | compact | hecate")
      ->capture_default_str();
  app.add_option("--output", o.output, "Plan JSON to write")->required();
  auto* cur = app.add_option("--current", o.req.current_path, "Current plan JSON, for re-placement");
  auto* fail_opt = app.add_option("--failed-nodes", o.failed, "Failed node ids, e.g. 3,7 (needs --current)");
  auto* add_opt = app.add_option("--added-nodes", o.added, "Number of nodes added (needs --current)");
  fail_opt->needs(cur);
  add_opt->needs(cur);
  fail_opt->excludes(add_opt);
  auto* svg_opt = app.add_option("--svg", o.svg, "Also draw GPU load before/after and the replica map");
  app.add_option("--svg-layer", o.req.svg_layer, "Layer drawn in the replica map (0 .. layers - 1)")
      ->capture_default_str()
      ->needs(svg_opt);
  app.add_option("--max-failures", o.req.placement.recovery.max_failures, "Recovery probability for k = 1..K failed nodes")
      ->capture_default_str();
  app.add_option("--mc-samples", o.req.placement.recovery.mc_samples, "Monte Carlo samples per k")->capture_default_str();
  app.add_option("--seed", o.req.placement.recovery.seed, "Monte Carlo seed")->capture_default_str();
  app.add_option("--exact-limit", o.exact_limit, "Enumerate exactly when C(N,k) <= this")->capture_default_str();
  app.add_option("--window", o.req.load_options.window, "Moving average over the last W load snapshots (0: all)")
      ->capture_default_str();
  app.add_option("--snapshot", o.req.load_options.snapshot, "Use one load snapshot by key (e.g. SmartMoE iteration)");
  app.add_option("--experts", o.req.load_options.experts, "Experts per layer for router traces (0: infer)");
  app.add_option("--overlap-degree", o.req.placement.overlap_degree, "hecate: overlap degree t (default: all experts)");
  app.add_option("--memory", o.req.placement.memory,
                 "hecate: memory capacity m, distinct experts materialized per GPU per layer, 1..S (default: "
                 "--slots-per-gpu; with m < S the other slots repeat experts the GPU holds)");
  auto* expert_bytes_opt =
      tool::add_size_option(app, "--expert-bytes", o.expert_bytes, "Bytes per expert replica (a size: 64M), to report bytes moved");
  auto* prev_opt = app.add_option("--previous", o.req.previous_path,
                                  "Previous plan JSON: re-place for the new --loads on its cluster, counting the "
                                  "expert copies moved (balanced-ft moves, fault tolerance kept)");
  prev_opt->excludes(cur);
  auto* max_moved_opt = tool::add_size_option(app, "--max-moved-bytes", o.max_moved_bytes,
                 "With --previous or --current --failed-nodes: bytes (a size: 2G) the balance moves may copy (needs --expert-bytes; the copies that keep "
                 "the fault tolerance are made regardless)");
  auto* weight_opt = app.add_option("--migration-weight", o.req.migration_weight,
                 "With --previous, or --current --failed-nodes: take moves only when the imbalance removed (fraction "
                 "of total load) is at least this x the fraction of all replicas copied (0: every improving move). "
                 "With --current it (or --max-moved-bytes) starts from what survives on the nodes left and "
                 "schedules the copies in rounds")
      ->capture_default_str();
  auto* report_opt = app.add_flag("--report", o.req.report,
               "Also print a Pareto table: every algorithm's balancedness, recovery for k = 1..f+1, copies from "
               "--previous and run time (in the --json summary as \"pareto\"), and per layer the gap to the "
               "proven upper bound on balance under f (\"balance_bound\")");
  app.add_option("--recovery-weight", o.req.placement.recovery_weight,
                 "balanced-ft: 0 = the most balanced placement, 1 = the most recoverable when f nodes fail (at "
                 "least Lazarus'), between: per layer the largest (1-w) x balancedness + w x p(f), same f")
      ->capture_default_str();
  app.add_option("--min-recovery", o.min_recovery,
                 "k:p, e.g. 2:0.95: balanced-ft with the smallest --recovery-weight whose plan keeps every expert "
                 "with probability >= p when k nodes fail (exit 2 when even weight 1 falls short)");
  app.add_flag("--pareto", o.req.pareto,
               "With --report: also print balanced-ft's balance/recovery front for --recovery-weight 0, 0.25, "
               "0.5, 0.75, 1 beside lazarus (balancedness, p(k) for k = 1..f+1, copies; \"front\" in --json)")
      ->needs(report_opt);
  app.add_flag("--dispatch", o.req.dispatch,
               "Also compute a token dispatch plan for uneven replicas: per slot the share of its expert's tokens "
               "that balances GPU loads best (plan key \"dispatch\"; balancedness for it and for equal shares)");
  app.add_option("--sglang-expert-location", o.sglang_out,
                 "Also write the plan as SGLang's --init-expert-location JSON ({\"physical_to_logical_map\"})");
  app.add_option("--layers-map", o.layers_map,
                 "The model's decoder layers and which are MoE: D:a-b[,c...] (e.g. 61:3-60 for DeepSeek-V3) or its "
                 "config.json. Loads may then have a row per decoder layer (dense rows dropped); "
                 "--sglang-expert-location gets a row per decoder layer, --vllm-eplb-state one per MoE layer");
  app.add_option("--pp-size", o.pp_size,
                 "With --layers-map: pipeline stages; reports each stage's decoder layers (its SGLang rows) and "
                 "MoE layers (its vLLM rows), split as vLLM's and SGLang's get_pp_indices do");
  app.add_option("--pp-layer-partition", o.pp_partition,
                 "With --layers-map: decoder layers per stage, a,b,... (as VLLM_PP_LAYER_PARTITION / "
                 "SGLANG_PP_LAYER_PARTITION), instead of the engines' default split");
  app.add_option("--vllm-eplb-state", o.vllm_out,
                 "Also write the plan as vLLM EPLB state tensors (safetensors: physical_to_logical_map, "
                 "logical_to_physical_map, logical_replica_count)");
  tool::add_threads_option(app, o.threads);
  tool::add_dry_run_option(app, o.dry_run);
  tool::add_overwrite_option(app, o.overwrite,
                             "Accepted as in every tool; moe-replace replaces its output files anyway (whole, "
                             "atomically), as job scripts rerun it");
  return {cur, expert_bytes_opt, max_moved_opt, weight_opt};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Plan which GPU holds which expert replicas: balanced load, and every expert alive after node failures",
               "moe-replace"};
  tool::CommonOptions common;
  tool::MoeReplaceOptions o;
  const Given given = add_options(app, o);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  o.current_given = given.current->count() > 0;
  o.expert_bytes_given = given.expert_bytes->count() > 0;
  o.max_moved_given = given.max_moved->count() > 0;
  o.weight_given = given.weight->count() > 0;
  // Large buffers (per-layer matrices, the plan text pieces) come and go per layer: kept on the heap,
  // each reuses the pages of the previous one instead of a fresh mmap faulted in and zeroed page by
  // page (the re-placements at 1,024 nodes spent a quarter of their CPU in page faults).
  keep_large_buffers_on_heap({.one_arena = true, .trim_threshold = 1 << 30});
  return tool::run("moe-replace", [&] {
    return tool::in_threads(o.threads, [&] {
      o.check();
      return tool::print_result("moe-replace", tool::run_moe_replace(o), common.json);
    });
  });
}
