// ucp-extract and ucp-union: their options (one struct, the two tools take the same ideas) and runs.
#pragma once
#include <string>

#include "to_universal/convert.h"
#include "tool/result.h"

namespace ucpkit::tool {

struct UcpConvertOptions {
  std::string input, output;            // --input, --output
  to_universal::ConvertOptions convert;  // --patterns, --threads, --no-sync, --tolerance, ... (reporter set by the run)
  bool verify = true;                   // --verify / --no-verify: zip CRC-32 of the records read
  bool dry_run = false;                 // --dry-run
  // Cross-option rules: none today (each option is checked where it is parsed; the library refuses an
  // output that is an input); kept so that every tool validates in one place.
  void check() const {}
};

// The conversions (or their --dry-run plans) as results; other MPI ranks than 0 get an empty result.
Result run_ucp_extract(const UcpConvertOptions& options);
Result run_ucp_union(const UcpConvertOptions& options);

}  // namespace ucpkit::tool
