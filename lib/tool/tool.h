// What every tool driver shares: error reporting and exit codes, verbosity, progress, resource usage.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/reporter.h"
#include "tool/progress.h"

namespace ucpkit::tool {

// Exit codes of the command-line contract.
enum ExitCode : int { kSuccess = 0, kFailure = 1, kUsage = 2 };

// Runs a tool body and maps exceptions to `tool: error: message` on stderr and the exit code:
// UsageError -> 2, Error and any other exception -> 1. The message is one line written at once
// (control and non-ASCII bytes as \xNN, cut at 600 characters); under an MPI launcher usage errors are
// printed by rank 0 only and ReportedElsewhere (a rank whose failure rank 0 reports) not at all.
int run(const char* tool_name, const std::function<int()>& body);

// --json: a run that fails prints, on stdout (rank 0), the envelope with output null and an "error"
// object {"message", "exit_code", "file" (the file the message is about, or null)} instead of nothing,
// unless a summary was printed already (ucp-info's failed check prints its own). set_json is called by
// the option parse; print_json calls summary_printed.
void set_json(bool json);
void summary_printed();
void print_error_envelope(const char* tool_name, const std::string& what, int exit_code);

// Verbosity: -1 quiet, 0 normal, 1+ verbose. Messages go to stderr.
void set_verbosity(int level);
int verbosity();
void info(const std::string& message);     // shown unless quiet
void verbose(const std::string& message);  // shown with -v
void warn(const std::string& message);     // always shown, as "tool: warning: ..."

// Peak resident set size of this process, in bytes.
uint64_t peak_rss_bytes();

// The Reporter the tools pass into the library: warn() for warnings, verbose() for details, a
// Progress (tool/progress.h) for progress, and with -v the phases' names and times (rank 0 only).
Reporter console_reporter();

// The tool's name as given to run() ("ucpkit" before), and this process's rank under an MPI
// launcher (0 otherwise; read from the launcher's environment, lib/tool does not link MPI).
const char* tool_name();
int launcher_rank();

}  // namespace ucpkit::tool
