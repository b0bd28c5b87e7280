// The message of the ucpkit::Error a call throws, for tests that check refusals in-process.
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace ucpkit::testing {

// What `f` throws as ucpkit::Error (UsageError included); `none` when it returns. Other exceptions
// propagate (a test failure, not a refusal).
inline std::string error_of(const std::function<void()>& f, const std::string& none = "") {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const UsageError& e) {  // not an Error (core/error.h): caught by name
    return e.what();
  }
  return none;
}

}  // namespace ucpkit::testing
