// Error helpers.
#include "core/error.h"

#include <cstdio>
#include <exception>

namespace ucpkit {

void fail(const std::string& path, const std::string& what) { throw Error(path + ": " + what); }

std::string escaped_brief(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

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
