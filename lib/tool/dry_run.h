// --dry-run of every tool: what a run would write, as a few human lines and as JSON fields, made from
// the plan the tool's library computes (nothing is written). Where a tool has --plan, --dry-run is
// the short human form of that plan.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "to_universal/convert.h"

namespace ucpkit::tool {

struct DryRun {
  std::string text;      // the human summary (ends in a newline)
  nlohmann::json fields;  // the same facts for the --json envelope ("dry_run": true, "would_write", ...)
};

// ucp-extract / ucp-union: plans the conversion of `input` (read-only) and says what `output` would hold.
DryRun extract_dry_run(const std::string& input, const std::string& output, const to_universal::ConvertOptions& options);
DryRun union_dry_run(const std::string& input, const std::string& output, const to_universal::ConvertOptions& options);

// What an existing `output` means for the run, decided as the run decides it (core/staging): "" when it does
// not exist, a note to print after its name under --overwrite (`overwrite`) or --reuse-output (`reuse`),
// otherwise the run's own refusal (Error: "output already exists ...").
std::string existing_note(const std::string& output, bool overwrite, bool reuse = false);

// ucp-load: from reshard::plan_json's plan; `note`: existing_note's for the output.
DryRun load_dry_run(const nlohmann::json& plan, const std::string& output, const std::string& note = "");

// pec-save: from pec_save's plan (SaveOptions::plan_only); `store` and `fast_store` the tier folders.
DryRun save_dry_run(const nlohmann::json& plan, const std::string& store, const std::string& fast_store);

// pec-restore: from restore_plan_to_json's plan.
DryRun restore_dry_run(const nlohmann::json& plan);

// moe-replace: the plan computed (its --json summary) and the files it would write.
DryRun replace_dry_run(const nlohmann::json& summary, const std::vector<std::string>& files);

// Prints a dry run on stdout: its text, or with --json (`json`) the envelope (output null) around its fields.
void print_dry_run(const std::string& tool, const DryRun& dry_run, bool json);

// "12.3 MiB" (binary units, one decimal).
std::string bytes_text(uint64_t bytes);

}  // namespace ucpkit::tool
