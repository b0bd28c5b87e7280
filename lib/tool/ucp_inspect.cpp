// ucp-info and ucp-diff runs.
#include "tool/ucp_inspect.h"

namespace ucpkit::tool {

Result run_ucp_info(const UcpInfoOptions& options) {
  const auto info = inspect::describe(options.input, options.info);
  Result r;
  r.fields = info.to_json();
  if (verbosity() >= 0) r.text = info.text();
  if (const auto* failed = info.first_failure()) r.failure = failed->error;
  return r;
}

Result run_ucp_diff(const UcpDiffOptions& options) {
  inspect::DiffOptions diff = options.diff;
  diff.reporter = console_reporter();
  const auto d = inspect::diff_checkpoints(options.a, options.b, diff);
  Result r;
  r.fields = d.to_json();
  if (verbosity() >= 0) r.text = d.text();
  r.exit_code = d.equal() ? kSuccess : inspect::kDiffer;
  return r;
}

}  // namespace ucpkit::tool
