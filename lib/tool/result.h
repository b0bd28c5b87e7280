// The one result every tool's run returns: what the --json envelope prints, or the human form of it.
// A tool's run (tool/<tool>.h) decides what to say; print_result alone decides where it goes.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tool/dry_run.h"
#include "tool/tool.h"

namespace ucpkit::tool {

struct Result {
  std::optional<std::string> output;   // the envelope's "output" (nullopt: null, nothing written)
  nlohmann::json fields;               // the tool's own envelope keys; null: no envelope (other MPI ranks, --watch)
  std::string document;                // --plan: printed as is on stdout, with or without --json, no envelope
  std::string text;                    // the human summary on stdout without --json
  bool text_on_stderr_with_json = false;  // with --json, `text` goes to stderr (pec-restore's table stays visible)
  std::vector<std::string> notes_before;  // messages (tool::info) before the summary
  std::vector<std::string> notes;         // messages after it
  std::vector<std::string> text_notes;    // messages after it, without --json only
  std::optional<std::string> failure;  // an error reported after the summary (exit 1): ucp-info's failed check
  int exit_code = kSuccess;
};

// A dry run's summary (tool/dry_run.h) as a result: output null, its text and fields.
Result dry_run_result(const DryRun& dry_run);

// Prints `result` of `tool` (the envelope with --json, `text` without) and returns its exit code;
// throws Error(*result.failure) after printing when it is set.
int print_result(const std::string& tool, const Result& result, bool json);

}  // namespace ucpkit::tool
