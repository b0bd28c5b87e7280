// ucp-extract and ucp-union runs.
#include "tool/ucp_convert.h"

#include "io/torch/verify.h"
#include "parallel/mpi_session.h"

namespace ucpkit::tool {

namespace {

Result convert(const UcpConvertOptions& options, bool extract) {
  set_verify_files_crc(options.verify);
  to_universal::ConvertOptions convert = options.convert;
  convert.reporter = console_reporter();
  const bool root = parallel::MpiSession::get().rank() == 0;
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
                    (extract ? ", " + std::to_string(s.files_written) + " files" : std::string()) + " -> " +
                    options.output);
  return r;
}

}  // namespace

Result run_ucp_extract(const UcpConvertOptions& options) { return convert(options, true); }
Result run_ucp_union(const UcpConvertOptions& options) { return convert(options, false); }

}  // namespace ucpkit::tool
