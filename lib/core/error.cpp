// Error helpers.
#include "core/error.h"

#include <exception>

namespace ucpkit {

void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

namespace {
thread_local std::string g_failed_file;
}

FileScope::FileScope(std::string path) : path_(std::move(path)), uncaught_(std::uncaught_exceptions()) {
  g_failed_file.clear();  // a failure recorded earlier was handled (caught) by now
}

FileScope::~FileScope() {
  // Unwinding because of an exception thrown inside: the innermost scope records itself first.
  if (std::uncaught_exceptions() > uncaught_ && g_failed_file.empty()) g_failed_file = path_;
}

const std::string& failed_file() { return g_failed_file; }
void clear_failed_file() { g_failed_file.clear(); }

}  // namespace ucpkit
