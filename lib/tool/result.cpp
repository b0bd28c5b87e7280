// Printing a tool's result.
#include "tool/result.h"

#include <iostream>

#include "core/error.h"
#include "core/mapped_file.h"
#include "tool/envelope.h"
#include "tool/tool.h"

namespace ucpkit::tool {

Result dry_run_result(const DryRun& dry_run) {
  Result r;
  r.text = dry_run.text;
  r.fields = dry_run.fields;
  return r;
}

int print_result(const std::string& tool, const Result& result, bool json) {
  // A result computed from an input that shrank while it was read (core/mapped_file) is not printed:
  // the read-only tools (ucp-info, ucp-diff) commit nothing, so this is where they refuse.
  MappedFile::check_inputs_intact();
  for (const auto& n : result.notes_before) info(n);
  if (!result.document.empty()) {
    std::cout << result.document;
  } else if (json) {
    if (result.text_on_stderr_with_json) std::cerr << result.text;
    if (!result.fields.is_null())
      print_json(result.output ? envelope(tool, *result.output, result.fields) : envelope(tool, nullptr, result.fields));
  } else {
    std::cout << result.text;
    for (const auto& n : result.text_notes) info(n);
  }
  for (const auto& n : result.notes) info(n);
  if (result.failure) throw Error(*result.failure);
  return result.exit_code;
}

}  // namespace ucpkit::tool
