// pec-restore's option check and run.
#include "tool/pec_restore.h"

#include <unistd.h>

#include <filesystem>

#include "core/atomic_file.h"
#include "core/confine.h"
#include "core/error.h"
#include "core/json_input.h"
#include "formats/deepspeed/checkpoint_dir.h"
#include "parallel/mpi_session.h"
#include "pec/restore_plan.h"
#include "tool/size.h"
#include "tool/typed_name.h"

namespace ucpkit::tool {
namespace {
namespace fs = std::filesystem;

// `path` with symbolic links of its existing part resolved (a link into the store is the store).
fs::path resolved(const std::string& path) { return fs::weakly_canonical(fs::absolute(path)); }

// True when `p` is `dir` or lies under it (both resolved).
bool inside(const fs::path& p, const fs::path& dir) {
  auto d = dir.begin(), q = p.begin();
  for (; d != dir.end() && !d->empty(); ++d, ++q)
    if (q == p.end() || *q != *d) return false;
  return true;
}

// --report must not replace anything this run reads or writes: the store tiers (their manifests and
// objects), the restored step folder (and its staging folders), `latest` / `latest_universal`; and its
// folder must exist (or be the output folder, which the restore makes), so that a restore is never
// committed and then reported as failed.
void check_report_path(const std::string& report, const pec::RestoreOptions& r) {
  const std::string shown = escaped_brief(report, 200);
  auto refuse = [&](const std::string& why) { throw UsageError("--report " + shown + ": " + why); };
  // The report replaces its own name (an atomic rename over it, a link included): its folder is resolved.
  const fs::path name = fs::path(report).filename();
  if (name.empty() || name == "." || name == "..") refuse("is a folder");
  const fs::path rep = resolved(fs::absolute(report).parent_path().string()) / name;
  if (!r.store.empty() && inside(rep, resolved(r.store))) refuse("inside the store " + escaped_brief(r.store, 200) + " (it would replace a store file)");
  if (!r.fast_store.empty() && inside(rep, resolved(r.fast_store)))
    refuse("inside the fast store " + escaped_brief(r.fast_store, 200) + " (it would replace a store file)");
  fs::path out = r.output.empty() ? fs::path() : resolved(r.output);
  if (!out.empty() && formats::deepspeed::looks_like_step_folder(out.filename().string()))
    out = out.parent_path();  // the step folder given
  if (!out.empty() && rep == out) refuse("is the output folder");
  if (!out.empty() && inside(rep, out) && rep != out) {
    const std::string first = fs::relative(rep, out).begin()->string();
    if (first == formats::deepspeed::kLatestName || first == formats::deepspeed::kLatestUniversalName)
      refuse("is the output's " + first + " file");
    if (formats::deepspeed::looks_like_step_folder(first))
      refuse("inside the output's step folder " + escaped_brief((out / first).string(), 200));
  }
  std::error_code ec;
  if (fs::is_directory(rep, ec)) refuse("is a folder");
  const fs::path dir = rep.parent_path();
  if (!out.empty() && dir == out) return;  // the output folder: the restore makes it before its commit
  if (!fs::is_directory(dir, ec)) refuse("its folder " + escaped_brief(dir.string(), 200) + " does not exist");
  if (::access(dir.c_str(), W_OK) != 0) refuse("its folder " + escaped_brief(dir.string(), 200) + " is not writable");
}

}  // namespace

void PecRestoreOptions::check() {
  restore.step = step;
  if (memory % (1 << 20) != 0) {
    const std::string name = typed_name(args, {"--memory", "--memory-mb"});
    throw UsageError(name + (name == "--memory" ? " " : " gives ") + size_text(memory) + ": give whole MiB (e.g. 256M)");
  }
  restore.memory_mb = memory >> 20;
  if (restore.plt_threshold < 0) throw UsageError("--plt-threshold must be >= 0");
  if (restore.capacity_factor < 1) throw UsageError("--capacity-factor must be >= 1");
  if (!report.empty()) check_report_path(report, restore);
  // The restored folder is written beside the store, never into it: its commit would replace store
  // files (an output folder that holds the store, a checkpoint root, is fine).
  for (const auto& [store, option] : {std::pair{restore.store, "--store"}, std::pair{restore.fast_store, "--fast-store"}})
    if (!store.empty() && !restore.output.empty() && path_within(restore.output, store))
      throw UsageError("--output " + escaped_brief(restore.output, 200) + (path_within(store, restore.output) ? " is " : " lies inside ") +
                       option + " " + escaped_brief(store, 200) + ": write the restored checkpoint outside the store");
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
      r.document = json_text(plan, 2) + "\n";
    else
      r = dry_run_result(restore_dry_run(plan));
    return r;
  }
  const auto done = pec::pec_restore(restore);
  if (!root) return r;  // under mpirun rank 0 reports
  if (!o.report.empty()) write_file_atomic(o.report, json_text(done.report, 2) + "\n", true);
  r.output = done.output_dir;
  r.fields = json_safe(done.report);
  r.fields["bytes_written"] = done.bytes_written;
  if (verbosity() >= 0) r.text = pec::report_table(done.report);
  r.text_on_stderr_with_json = true;
  r.text_notes.push_back("wrote " + done.output_dir);
  return r;
}

}  // namespace ucpkit::tool
