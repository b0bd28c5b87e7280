// pec-save: partial expert checkpointing into a crash-safe store.
#include "tool/cli.h"
#include "tool/pec_save.h"

namespace {

using namespace ucpkit;

void add_options(CLI::App& app, tool::PecSaveOptions& o) {
  auto& s = o.save;
  app.add_option("--input,--checkpoint", s.checkpoint, "Full checkpoint folder written by the training job");
  app.add_option("--output,--store", s.store, "PEC store folder (durable tier) to save into")->required();
  app.add_option("--step", o.step,
                 "Training step being saved (default: the checkpoint's; refused when it disagrees with the tag, `latest`, "
                 "global_steps or iteration)")
      ->check(tool::in_range(0, 9007199254740992.0));
  app.add_option("--watch", o.watch.dir,
                 "Persist agent: wait for each new global_step<N> that `latest` names in this folder, save it, "
                 "until SIGTERM (replaces --checkpoint/--step)");
  app.add_option("--poll-seconds", o.watch.poll_seconds, "With --watch: how often `latest` is read")
      ->check(tool::in_range(0.01, 86400, false))
      ->capture_default_str();
  app.add_option("--keep-snapshots", o.watch.keep_snapshots,
                 "With --watch: after each save keep only the newest N global_step folders of the watched folder (0: keep all)")
      ->check(tool::in_range(0, 1e6))
      ->capture_default_str();
  app.add_option("--policy", s.policy, "Expert selection policy")
      ->required()
      ->check(CLI::IsMember({"sequential", "load-aware", "budget"}));
  app.add_option("--k", s.k, "Experts saved per MoE layer")->check(tool::in_range(0, 1e6));
  tool::add_size_option(app, "--budget,--budget-bytes", o.budget, "Byte budget for experts (budget policy; a size: 2G)");
  app.add_option("--bandwidth", o.bandwidth, "Host bandwidth in bytes/s (budget = bandwidth x iteration time)")
      ->check(tool::in_range(1, 1e15, false));
  app.add_option("--iteration-seconds", o.iteration_seconds, "Iteration time in seconds (with --bandwidth)")
      ->check(tool::in_range(1e-6, 1e6, false));
  app.add_option("--tokens", s.tokens, "Tokens per expert since the previous save (JSON, CSV or router JSONL)");
  app.add_option("--fast-store", s.fast_store, "Fast tier folder (e.g. /dev/shm/...)");
  app.add_option("--k-snapshot", s.k_snapshot, "Experts per layer into the fast tier")
      ->check(tool::in_range(0, 1e6));
  app.add_option("--k-persist", s.k_persist, "Experts per layer into the durable store")
      ->check(tool::in_range(0, 1e6));
  app.add_option("--keep", s.keep, "Durable tier: keep what restoring the latest N steps needs")
      ->check(tool::in_range(1, 1e6))
      ->capture_default_str();
  app.add_option("--keep-fast", s.keep_fast, "Fast tier: keep the non-expert state of the latest N steps and only expert copies newer than the durable tier's")
      ->check(tool::in_range(1, 1e6))
      ->capture_default_str();
  app.add_option("--zstd-level", s.zstd_level, "zstd compression level (0: store the bytes uncompressed)")
      ->check(tool::in_range(0, 22))
      ->capture_default_str();
  tool::add_size_option(app, "--chunk", o.chunk, "Largest stored object (a size: 64M; files are split)",
                        {{"--chunk-mib", 1 << 20}});
  app.add_option("--ep", s.open.ep_size, "Expert-parallel degree (default: inferred, 1 for universal checkpoints)")
      ->check(tool::in_range(1, tool::kMaxDegree));
  app.add_flag("--data-before-expert", s.open.data_before_expert, "use_data_before_expert_parallel_ rank order");
  app.add_flag("--no-bootstrap", o.no_bootstrap, "Do not add experts the durable store never saved");
  tool::add_verify_option(app, o.verify,
               "Also check the zip CRC-32 of every record of the torch files parsed to find the experts (a full read of "
               "every optimizer shard, most of which a partial save does not store)");
  app.add_flag("--plan", o.plan, "Print the selection and the fully sharded save plan as JSON, save nothing");
  tool::add_threads_option(app, o.threads);
  tool::add_dry_run_option(app, o.dry_run);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Save non-expert state and a selection of experts into a PEC store", "pec-save"};
  tool::CommonOptions common;
  tool::PecSaveOptions o;
  add_options(app, o);
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  o.args = tool::arguments(argc, argv);
  return tool::run("pec-save", [&] {
    return tool::in_threads(o.threads, [&] {
      o.check();
      return tool::print_result("pec-save", tool::run_pec_save(o), common.json);
    });
  });
}
