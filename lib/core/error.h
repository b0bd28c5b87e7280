// Error types shared by the library and the tools: runtime failures (exit 1) and usage errors (exit 2).
#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace ucpkit {

// A runtime failure: I/O, corrupt or inconsistent input. Tools exit with code 1.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A failure another process reports for this one (under mpirun: rank 0 prints the failing rank's
// message once). Tools exit with code 1 without printing it.
class ReportedElsewhere : public Error {
 public:
  using Error::Error;
};

// A usage error: bad or contradictory options. Tools exit with code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Prefixes an error message with the file it concerns: "<path>: <what>".
[[noreturn]] void fail(const std::string& path, const std::string& what);

// `s` for one error line: at most `max` bytes, control bytes, backslashes and non-ASCII as \xNN (so
// the text is unambiguous), "..." when cut.
std::string escaped_brief(std::string_view s, size_t max = 80);

// Marks the file a block of code examines (RAII). When an Error leaves the block, the innermost such
// file is remembered for this thread, so that naming_file() can add it to messages thrown by code that
// does not know the file (pickle value accessors: "expected a fragment_address, found object").
class FileScope {
 public:
  explicit FileScope(std::string path);
  ~FileScope();
  FileScope(const FileScope&) = delete;
  FileScope& operator=(const FileScope&) = delete;

 private:
  std::string path_;
  int uncaught_;
};

// The file of the innermost FileScope an Error left since the last clear ("" when none).
const std::string& failed_file();
void clear_failed_file();

// Runs `f`; an Error (not a UsageError / ReportedElsewhere) whose message does not contain the file
// it left (FileScope) is thrown again as "<file>: <message>".
template <class F>
auto naming_file(F&& f) -> decltype(f()) {
  clear_failed_file();
  try {
    return f();
  } catch (const ReportedElsewhere&) {
    throw;
  } catch (const Error& e) {
    const std::string& file = failed_file();
    const std::string what = e.what();
    if (file.empty() || what.find(file) != std::string::npos) throw;
    throw Error(file + ": " + what);
  }
}

}  // namespace ucpkit
