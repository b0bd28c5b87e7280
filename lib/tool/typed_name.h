// Which spelling of an option the command line used, so that a usage error names the option as typed
// (`--budget` or its old name `--budget-bytes`).
#pragma once
#include <string>
#include <vector>

namespace ucpkit::tool {

// The last of `names` given in `args` (`--name value` or `--name=value`; arguments after `--` are
// not options); names[0] when none is.
std::string typed_name(const std::vector<std::string>& args, const std::vector<std::string>& names);

}  // namespace ucpkit::tool
