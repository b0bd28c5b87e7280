// pec-save's option check and run.
#include "tool/pec_save.h"

#include <cstdio>
#include <iostream>
#include <memory>

#include "core/error.h"
#include "core/json_input.h"
#include "io/torch/verify.h"
#include "tool/size.h"
#include "tool/typed_name.h"

namespace ucpkit::tool {

void PecSaveOptions::check() {
  const std::string budget_name = typed_name(args, {"--budget", "--budget-bytes"});
  if (static_cast<long long>(budget) < 0) throw UsageError(budget_name + " must be >= 0");
  save.budget_bytes = budget;
  if (bandwidth > 0 || iteration_seconds > 0) {
    if (bandwidth <= 0 || iteration_seconds <= 0) throw UsageError("--bandwidth and --iteration-seconds go together");
    if (budget > 0) throw UsageError("give " + budget_name + " or --bandwidth/--iteration-seconds, not both");
    save.budget_bytes = static_cast<uint64_t>(bandwidth * iteration_seconds);
  }
  if (save.budget_bytes > 0 && save.policy != "budget")
    throw UsageError((budget > 0 ? budget_name + " needs" : std::string("--bandwidth/--iteration-seconds need")) +
                     " --policy budget");
  if (chunk < 4096) {
    const std::string name = typed_name(args, {"--chunk", "--chunk-mib"});
    throw UsageError(name + (name == "--chunk" ? " " : " gives ") + size_text(chunk) + ": must be at least 4K");
  }
  save.chunk_bytes = chunk;
  save.bootstrap = !no_bootstrap;
  save.step = step;
  save.plan_only = plan || dry_run;
  const std::string input_name = typed_name(args, {"--checkpoint", "--input"});
  if (!watch.dir.empty()) {
    if (!save.checkpoint.empty() || step >= 0) throw UsageError("--watch replaces " + input_name + " and --step");
    if (save.plan_only) throw UsageError(std::string("--watch and ") + (plan ? "--plan" : "--dry-run") + " do not go together");
  } else if (save.checkpoint.empty()) {
    throw UsageError(input_name + " is required (or --watch)");
  }
}

namespace {

// The lines saying what each tier stored.
std::vector<std::string> tier_lines(const nlohmann::json& summary) {
  std::vector<std::string> lines;
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
    lines.push_back(line);
  }
  return lines;
}

}  // namespace

Result run_pec_save(const PecSaveOptions& o) {
  // A partial save reads only the bytes it stores (plus the zip directories and pickles it parses);
  // checking every record's CRC-32 would read whole optimizer shards (docs/pec.md, Figures).
  if (!o.verify) set_verify_files_crc(false);
  pec::SaveOptions save = o.save;
  save.reporter = console_reporter();
  Result r;
  if (!o.watch.dir.empty()) {
    const pec::WatchResult w =
        pec::watch_and_save(save, o.watch, [](const std::string& line) { std::cout << line << std::endl; });
    r.exit_code = w.failed > 0 ? kFailure : kSuccess;  // a step NOT saved (docs/pec.md, persist agent)
    return r;
  }
  std::unique_ptr<Progress> bar;
  uint64_t total = 0;
  const auto summary = pec::pec_save(
      save,
      [&](uint64_t n) {
        if (!bar) bar = std::make_unique<Progress>("pec-save", total, ProgressUnit::bytes);
        bar->advance(n);
      },
      &total);
  if (bar) bar->finish();
  if (summary.empty()) return r;  // other MPI ranks
  if (summary.value("step_inferred", false))
    // step_from names a file or folder: its bytes are escaped (a control byte in a folder name would
    // otherwise reach the terminal) and cut.
    r.notes_before.push_back("step " + summary["step"].dump() + " inferred from " +
                             escaped_brief(summary["step_from"].get<std::string>(), 240));
  if (o.plan) {
    r.document = json_text(summary, 2) + "\n";
  } else if (o.dry_run) {
    const auto notes = r.notes_before;
    r = dry_run_result(save_dry_run(summary, save.store, save.fast_store));
    r.notes_before = notes;
  } else {
    r.output = save.store;
    r.fields = json_safe(summary);
    r.text_notes = tier_lines(summary);
  }
  return r;
}

}  // namespace ucpkit::tool
