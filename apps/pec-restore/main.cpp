// pec-restore: rebuild a full checkpoint from a chain of partial expert checkpoints.
#include "parallel/mpi_session.h"
#include "tool/cli.h"
#include "tool/pec_restore.h"

namespace {

using namespace ucpkit;

void add_options(CLI::App& app, tool::PecRestoreOptions& o) {
  auto& r = o.restore;
  app.add_option("--input,--store", r.store, "PEC store folder (durable tier) to restore from")->required();
  app.add_option("--fast-store", r.fast_store, "Fast tier folder");
  app.add_option("--output", r.output, "Checkpoint folder to write")->required();
  app.add_option("--step", o.step, "Step to restore (default: latest committed)")
      ->check(tool::in_range(0, 9007199254740992.0));
  app.add_option("--tokens", r.tokens, "Tokens per expert per save interval, when the store has none (JSON, CSV or router JSONL)");
  app.add_option("--report", o.report, "Write the restore report (JSON) here");
  app.add_option("--plt-threshold", r.plt_threshold, "PLT threshold above which K doubles")
      ->check(tool::in_range(0, 1, false))
      ->capture_default_str();
  app.add_option("--capacity-factor", r.capacity_factor, "Capacity factor for experts restored from older states")
      ->check(tool::in_range(1, 1e6, false))
      ->capture_default_str();
  app.add_option("--ds-version", r.ds_version,
                 "Native MoE: DeepSpeed version line to write (0.14, 0.17.1, 0.19.2, 0.19.3, 0.19.5, or a release; "
                 "default: the saved checkpoint's)");
  tool::add_size_option(app, "--memory", o.memory,
                        "Memory budget (a size, whole MiB: 256M, 1G): buffers of the streaming writer (input block, "
                        "output window, zstd decoder per worker); restore memory does not grow with the checkpoint",
                        {{"--memory-mb", 1 << 20}});
  tool::add_overwrite_option(app, r.force, "Replace an existing global_step<N> folder under --output", "--force");
  tool::add_threads_option(app, o.threads);
  tool::add_dry_run_option(app, o.dry_run);
  app.add_flag("--plan", o.plan,
               "Print the restore plan as JSON (target step, each expert's source tier and step, objects read, files "
               "written) and write nothing");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Restore a complete checkpoint from a PEC store", "pec-restore"};
  tool::CommonOptions common;
  tool::PecRestoreOptions o;
  add_options(app, o);
  if (int rc = tool::parse_checkpoint_tool(app, argc, argv, common); rc >= 0) return rc;
  o.args = tool::arguments(argc, argv);
  const int rc = tool::run("pec-restore", [&] {
    return tool::in_threads(o.threads, [&] {
      o.check();
      return tool::print_result("pec-restore", tool::run_pec_restore(o), common.json);
    });
  });
  parallel::die_if_interrupted();  // temporary folder removed: die as the signal asked
  return rc;
}
