// Error helpers.
#include "core/error.h"

namespace ucpkit {

void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

}  // namespace ucpkit
