// ucp-info and ucp-diff: their options as the command line gives them and their runs.
#pragma once
#include <string>

#include "inspect/diff.h"
#include "inspect/info.h"
#include "tool/result.h"

namespace ucpkit::tool {

struct UcpInfoOptions {
  std::string input;          // the positional argument or --input
  inspect::InfoOptions info;  // --verify / --no-verify
  // Cross-option rules: none (one input, one flag); kept so that every tool validates in one place.
  void check() const {}
};

struct UcpDiffOptions {
  std::string a, b;           // the two checkpoints (positional)
  inspect::DiffOptions diff;  // --rtol, --atol, --tmp-dir, --threads, --max-listed, --verify (reporter set by the run)
  // Cross-option rules: none (each tolerance is checked where it is parsed); kept so that every tool
  // validates in one place.
  void check() const {}
};

// ucp-info: the description; a failed consistency check is the result's failure (exit 1).
Result run_ucp_info(const UcpInfoOptions& options);
// ucp-diff: the comparison; exit code 0 when equal, inspect::kDiffer when not.
Result run_ucp_diff(const UcpDiffOptions& options);

}  // namespace ucpkit::tool
