// pec-restore: rebuild a full checkpoint from a chain of partial expert checkpoints.
#include <iostream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "pec/restore.h"
#include "tool/cli.h"
#include "tool/dry_run.h"
#include "parallel/mpi_session.h"

int main(int argc, char** argv) {
  using namespace ucpkit;
  CLI::App app{"Restore a complete checkpoint from a PEC store", "pec-restore"};
  tool::CommonOptions common;
  pec::RestoreOptions o;
  o.reporter = tool::console_reporter();
  std::string report;
  long long step = -1;
  bool plan = false;
  app.add_option("--input,--store", o.store, "PEC store folder (durable tier) to restore from")->required();
  app.add_option("--fast-store", o.fast_store, "Fast tier folder");
  app.add_option("--output", o.output, "Checkpoint folder to write")->required();
  app.add_option("--step", step, "Step to restore (default: latest committed)");
  app.add_option("--tokens", o.tokens, "Tokens per expert per save interval, when the store has none (JSON, CSV or router JSONL)");
  app.add_option("--report", report, "Write the restore report (JSON) here");
  app.add_option("--plt-threshold", o.plt_threshold, "PLT threshold above which K doubles")->capture_default_str();
  app.add_option("--capacity-factor", o.capacity_factor, "Capacity factor for experts restored from older states")
      ->capture_default_str();
  app.add_option("--ds-version", o.ds_version,
                 "Native MoE: DeepSpeed version line to write (0.14, 0.17.1, 0.19.2, 0.19.3, 0.19.5, or a release; "
                 "default: the saved checkpoint's)");
  uint64_t memory = o.memory_mb << 20;
  tool::add_size_option(app, "--memory", memory,
                        "Memory budget (a size, whole MiB: 256M, 1G): buffers of the streaming writer (input block, "
                        "output window, zstd decoder per worker); restore memory does not grow with the checkpoint",
                        {{"--memory-mb", 1 << 20}});
  tool::add_overwrite_option(app, o.force, "Replace an existing global_step<N> folder under --output", "--force");
  int threads = 0;
  bool dry_run = false;
  tool::add_threads_option(app, threads);
  tool::add_dry_run_option(app, dry_run);
  app.add_flag("--plan", plan,
               "Print the restore plan as JSON (target step, each expert's source tier and step, objects read, files "
               "written) and write nothing");
  tool::add_pickle_options(app);
  tool::add_common_options(app, common);
  if (int rc = tool::parse(app, argc, argv, common); rc >= 0) return rc;
  const int rc = tool::run("pec-restore", [&] { return tool::in_threads(threads, [&] {
    o.step = step;
    if (memory % (1 << 20) != 0) throw UsageError("--memory " + tool::size_text(memory) + ": give whole MiB (e.g. 256M)");
    o.memory_mb = memory >> 20;
    if (o.plt_threshold < 0) throw UsageError("--plt-threshold must be >= 0");
    if (o.capacity_factor < 1) throw UsageError("--capacity-factor must be >= 1");
    if (plan || dry_run) {  // read-only: no output folder, no --report
      const pec::RestorePlan p = pec::pec_restore_plan(o);
      if (parallel::MpiSession::get().rank() != 0) return 0;
      if (plan) {
        std::cout << pec::restore_plan_to_json(p).dump(2) << "\n";
        return 0;
      }
      tool::print_dry_run("pec-restore", tool::restore_dry_run(pec::restore_plan_to_json(p)), common.json);
      return 0;
    }
    auto r = pec::pec_restore(o);
    if (parallel::MpiSession::get().rank() != 0) return 0;  // under mpirun rank 0 reports
    if (!report.empty()) write_file_atomic(report, r.report.dump(2) + "\n", true);
    std::string table = pec::report_table(r.report);
    if (common.json) {
      if (!common.quiet) std::cerr << table;
      nlohmann::json s = r.report;
      s["output"] = r.output_dir;
      s["bytes_written"] = r.bytes_written;
      s["seconds"] = r.seconds;
      tool::print_json(tool::envelope("pec-restore", r.output_dir, s));
    } else if (!common.quiet) {
      std::cout << table;
      tool::info("wrote " + r.output_dir);
    }
    return 0;
  }); });
  parallel::die_if_interrupted();  // temporary folder removed: die as the signal asked
  return rc;
}
