// The registry of ucp-load's output writers (output_writer.h).
#include "reshard/output_writer.h"

#include "core/error.h"
#include "core/registry.h"

namespace ucpkit::reshard {

namespace {
NamedTable<std::shared_ptr<const OutputWriter>>& writers() {
  static NamedTable<std::shared_ptr<const OutputWriter>> w;
  return w;
}
}  // namespace

bool register_output_writer(OutputFormat format, std::shared_ptr<const OutputWriter> writer) {
  return writers().set(std::string(output_format_name(format)), std::move(writer));
}

const OutputWriter& output_writer(OutputFormat format) {
  const std::string name(output_format_name(format));
  const auto w = writers().find(name);
  if (!w) throw Error("--format " + name + ": no writer registered (internal error)");
  return *w;
}

std::string output_formats_that(bool (OutputWriter::*has)() const) {
  std::string out;
  for (const auto& name : output_format_names()) {
    const auto w = writers().find(name);
    if (w && ((*w).*has)()) out += (out.empty() ? "" : ", ") + name;
  }
  return out;
}

}  // namespace ucpkit::reshard
