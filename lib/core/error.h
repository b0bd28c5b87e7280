// Error types shared by the library and the tools: runtime failures (exit 1) and usage errors (exit 2).
#pragma once
#include <stdexcept>
#include <string>

namespace ucpkit {

// A runtime failure: I/O, corrupt or inconsistent input. Tools exit with code 1.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A usage error: bad or contradictory options. Tools exit with code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Prefixes an error message with the file it concerns: "<path>: <what>".
[[noreturn]] void fail(const std::string& path, const std::string& what);

}  // namespace ucpkit
