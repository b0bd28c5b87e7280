// ucp-extract and ucp-union runs.
#include "tool/ucp_convert.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "io/torch/verify.h"
#include "parallel/mpi_session.h"

namespace ucpkit::tool {

namespace {

// ucp-extract and ucp-union record the source's files in plan.json and manifest.json, whose strings are
// UTF-8: an input path that is not (a folder named in Latin-1) is refused before anything is written, naming
// it, instead of failing in the final write with a JSON library message that names no file.
void require_utf8_input(const std::string& path) {
  try {
    (void)nlohmann::json(std::filesystem::absolute(path).string()).dump();
  } catch (const nlohmann::json::type_error&) {
    throw Error(escaped_brief(path) + ": the --input path is not valid UTF-8, and ucp-extract and ucp-union record "
                "paths in JSON (plan.json, manifest.json); rename the folder or link it under a UTF-8 name");
  }
}

Result convert(const UcpConvertOptions& options, bool extract) {
  require_utf8_input(options.input);
  set_verify_files_crc(options.verify);
  to_universal::ConvertOptions convert = options.convert;
  convert.reporter = console_reporter();
  const bool root = parallel::MpiSession::get().rank() == 0;
  if (!convert.audit.empty()) {
    if (options.dry_run) throw UsageError("--audit is not available with --dry-run (nothing is converted)");
    check_file_target(convert.audit);  // written after the commit: a folder it cannot go to is refused first
  }
  if (options.dry_run) {
    const DryRun d = extract ? extract_dry_run(options.input, options.output, convert)
                             : union_dry_run(options.input, options.output, convert);
    return root ? dry_run_result(d) : Result{};
  }
  const auto s = extract ? to_universal::run_extract(options.input, options.output, convert)
                         : to_universal::run_union(options.input, options.output, convert);
  if (!root) return {};
  Result r;
  r.output = s.output;
  r.fields = s.to_json();
  r.notes.push_back(std::to_string(s.params) + " parameters" +
                    (s.buffers ? ", " + std::to_string(s.buffers) + " buffers" : std::string()) +
                    (extract ? ", " + std::to_string(s.files_written) + " files" : std::string()) + " -> " +
                    options.output);
  return r;
}

}  // namespace

Result run_ucp_extract(const UcpConvertOptions& options) { return convert(options, true); }
Result run_ucp_union(const UcpConvertOptions& options) { return convert(options, false); }

}  // namespace ucpkit::tool
