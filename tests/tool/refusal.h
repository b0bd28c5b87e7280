// The usage error a tool's option check throws (exit 2 in the tool), for the tests of the checks.
#pragma once
#include <string>

#include "core/error.h"

namespace ucpkit::testing {

// What `options.check()` throws as UsageError, or "accepted"; any other exception fails the test.
// `options` is a copy: check() fills the library options from the command line's.
template <class Options>
std::string refusal(Options options) {
  try {
    options.check();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "accepted";
}

}  // namespace ucpkit::testing
