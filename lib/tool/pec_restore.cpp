// pec-restore's option check and run.
#include "tool/pec_restore.h"

#include "core/atomic_file.h"
#include "core/error.h"
#include "parallel/mpi_session.h"
#include "pec/restore_plan.h"
#include "tool/size.h"
#include "tool/typed_name.h"

namespace ucpkit::tool {

void PecRestoreOptions::check() {
  restore.step = step;
  if (memory % (1 << 20) != 0) {
    const std::string name = typed_name(args, {"--memory", "--memory-mb"});
    throw UsageError(name + (name == "--memory" ? " " : " gives ") + size_text(memory) + ": give whole MiB (e.g. 256M)");
  }
  restore.memory_mb = memory >> 20;
  if (restore.plt_threshold < 0) throw UsageError("--plt-threshold must be >= 0");
  if (restore.capacity_factor < 1) throw UsageError("--capacity-factor must be >= 1");
}

Result run_pec_restore(const PecRestoreOptions& o) {
  pec::RestoreOptions restore = o.restore;
  restore.reporter = console_reporter();
  const bool root = parallel::MpiSession::get().rank() == 0;
  Result r;
  if (o.plan || o.dry_run) {  // read-only: no output folder, no --report
    const auto plan = pec::restore_plan_to_json(pec::pec_restore_plan(restore));
    if (!root) return r;
    if (o.plan)
      r.document = plan.dump(2) + "\n";
    else
      r = dry_run_result(restore_dry_run(plan));
    return r;
  }
  const auto done = pec::pec_restore(restore);
  if (!root) return r;  // under mpirun rank 0 reports
  if (!o.report.empty()) write_file_atomic(o.report, done.report.dump(2) + "\n", true);
  r.output = done.output_dir;
  r.fields = done.report;
  r.fields["bytes_written"] = done.bytes_written;
  if (verbosity() >= 0) r.text = pec::report_table(done.report);
  r.text_on_stderr_with_json = true;
  r.text_notes.push_back("wrote " + done.output_dir);
  return r;
}

}  // namespace ucpkit::tool
