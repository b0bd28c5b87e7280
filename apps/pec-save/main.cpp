// pec-save: partial expert checkpointing into a crash-safe store.
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "io/torch/verify.h"
#include "pec/save.h"
#include "pec/watch.h"
#include "tool/cli.h"
#include "tool/dry_run.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Save non-expert state and a selection of experts into a PEC store", "pec-save"};
  tool::CommonOptions common;
  pec::SaveOptions o;
  o.reporter = tool::console_reporter();
  long long step = -1, budget = 0;
  double bandwidth = 0, iteration_seconds = 0;
  int chunk_mib = 64;
  bool no_bootstrap = false;
  bool verify = false;
  pec::WatchOptions watch;
  app.add_option("--input,--checkpoint", o.checkpoint, "Full checkpoint folder written by the training job");
  app.add_option("--output,--store", o.store, "PEC store folder (durable tier) to save into")->required();
  app.add_option("--step", step,
                 "Training step being saved (default: the checkpoint's; refused when it disagrees with the tag, `latest`, "
                 "global_steps or iteration)");
  app.add_option("--watch", watch.dir,
                 "Persist agent: wait for each new global_step<N> that `latest` names in this folder, save it, "
                 "until SIGTERM (replaces --checkpoint/--step)");
  app.add_option("--poll-seconds", watch.poll_seconds, "With --watch: how often `latest` is read")->capture_default_str();
  app.add_option("--keep-snapshots", watch.keep_snapshots,
                 "With --watch: after each save keep only the newest N global_step folders of the watched folder (0: keep all)")
      ->capture_default_str();
  app.add_option("--policy", o.policy, "Expert selection policy")
      ->required()
      ->check(CLI::IsMember({"sequential", "load-aware", "budget"}));
  app.add_option("--k", o.k, "Experts saved per MoE layer");
  uint64_t budget_size = 0;
  tool::add_size_option(app, "--budget,--budget-bytes", budget_size, "Byte budget for experts (budget policy; a size: 2G)");
  app.add_option("--bandwidth", bandwidth, "Host bandwidth in bytes/s (budget = bandwidth x iteration time)");
  app.add_option("--iteration-seconds", iteration_seconds, "Iteration time in seconds (with --bandwidth)");
  app.add_option("--tokens", o.tokens, "Tokens per expert since the previous save (JSON, CSV or router JSONL)");
  app.add_option("--fast-store", o.fast_store, "Fast tier folder (e.g. /dev/shm/...)");
  app.add_option("--k-snapshot", o.k_snapshot, "Experts per layer into the fast tier");
  app.add_option("--k-persist", o.k_persist, "Experts per layer into the durable store");
  app.add_option("--keep", o.keep, "Durable tier: keep what restoring the latest N steps needs")->capture_default_str();
  app.add_option("--keep-fast", o.keep_fast, "Fast tier: keep the non-expert state of the latest N steps and only expert copies newer than the durable tier's")->capture_default_str();
  app.add_option("--zstd-level", o.zstd_level, "zstd compression level (0: store the bytes uncompressed)")->capture_default_str();
  uint64_t chunk = static_cast<uint64_t>(chunk_mib) << 20;
  tool::add_size_option(app, "--chunk", chunk, "Largest stored object (a size: 64M; files are split)",
                        {{"--chunk-mib", 1 << 20}});
  app.add_option("--ep", o.open.ep_size, "Expert-parallel degree (default: inferred, 1 for universal checkpoints)");
  app.add_flag("--data-before-expert", o.open.data_before_expert, "use_data_before_expert_parallel_ rank order");
  app.add_flag("--no-bootstrap", no_bootstrap, "Do not add experts the durable store never saved");
  tool::add_verify_option(app, verify,
               "Also check the zip CRC-32 of every record of the torch files parsed to find the experts (a full read of "
               "every optimizer shard, most of which a partial save does not store)");
  app.add_flag("--plan", o.plan_only, "Print the selection and the fully sharded save plan as JSON, save nothing");
  int threads = 0;
  bool dry_run = false;
  tool::add_threads_option(app, threads);
  tool::add_dry_run_option(app, dry_run);
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  return tool::run("pec-save", [&] { return tool::in_threads(threads, [&] {
    budget = static_cast<long long>(budget_size);
    const bool print_plan = o.plan_only;
    if (dry_run) o.plan_only = true;
    // A partial save reads only the bytes it stores (plus the zip directories and pickles it parses);
    // checking every record's CRC-32 would read whole optimizer shards (docs/pec.md, Figures).
    if (!verify) set_verify_files_crc(false);
    o.step = step;
    if (budget < 0) throw UsageError("--budget-bytes must be >= 0");
    o.budget_bytes = static_cast<uint64_t>(budget);
    if (bandwidth > 0 || iteration_seconds > 0) {
      if (bandwidth <= 0 || iteration_seconds <= 0) throw UsageError("--bandwidth and --iteration-seconds go together");
      if (budget > 0) throw UsageError("give --budget-bytes or --bandwidth/--iteration-seconds, not both");
      o.budget_bytes = static_cast<uint64_t>(bandwidth * iteration_seconds);
    }
    if (o.budget_bytes > 0 && o.policy != "budget") throw UsageError("--budget-bytes needs --policy budget");
    if (chunk < 4096) throw UsageError("--chunk " + tool::size_text(chunk) + ": must be at least 4K");
    o.chunk_bytes = chunk;
    o.bootstrap = !no_bootstrap;
    if (!watch.dir.empty()) {
      if (!o.checkpoint.empty() || step >= 0) throw UsageError("--watch replaces --checkpoint and --step");
      if (o.plan_only) throw UsageError("--watch and --plan do not go together");
      const pec::WatchResult r = pec::watch_and_save(o, watch, [](const std::string& line) {
        std::cout << line << std::endl;
      });
      return r.failed > 0 ? 1 : 0;  // a step NOT saved (docs/pec.md, persist agent)
    }
    if (o.checkpoint.empty()) throw UsageError("--checkpoint is required (or --watch)");
    std::unique_ptr<tool::Progress> bar;
    uint64_t total = 0;
    auto summary = pec::pec_save(
        o,
        [&](uint64_t n) {
          if (!bar) bar = std::make_unique<tool::Progress>("pec-save", total, tool::ProgressUnit::bytes);
          bar->advance(n);
        },
        &total);
    if (bar) bar->finish();
    if (summary.empty()) return 0;  // other MPI ranks
    if (summary.value("step_inferred", false))
      tool::info("step " + summary["step"].dump() + " inferred from " + summary["step_from"].get<std::string>());
    if (print_plan) {
      std::cout << summary.dump(2) << "\n";
      return 0;
    }
    if (dry_run) {
      tool::print_dry_run("pec-save", tool::save_dry_run(summary, o.store, o.fast_store), common.json);
      return 0;
    }
    if (common.json) {
      tool::print_json(tool::envelope("pec-save", o.store, summary));
      return 0;
    }
    for (const auto& t : summary["tiers"]) {
      const auto& s = t["stats"];
      char line[400];
      std::snprintf(line, sizeof line,
                    "step %lld -> %s tier: %d experts, %.1f MiB (%.1f%% of the full %.1f MiB checkpoint; formula C_pec/C_full "
                    "%.1f%%), %.1f MiB on disk",
                    summary["step"].get<long long>(), t["tier"].get<std::string>().c_str(), s["experts_saved"].get<int>(),
                    s["bytes_logical"].get<double>() / 1048576.0, 100 * s["ratio_logical_vs_full"].get<double>(),
                    s["bytes_full_checkpoint"].get<double>() / 1048576.0, 100 * s["ratio_formula"].get<double>(),
                    s["bytes_stored"].get<double>() / 1048576.0);
      tool::info(line);
    }
    return 0;
  }); });
}
