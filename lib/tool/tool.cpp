// Tool driver helpers.
#include "tool/tool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include <atomic>
#include <filesystem>

#include "core/error.h"
#include "tool/envelope.h"

namespace ucpkit::tool {
namespace {
int g_verbosity = 0;
const char* g_tool = "ucpkit";
std::mutex g_print_mutex;

}  // namespace

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v); r && *r) return std::atoi(r);
  return 0;
}

const char* tool_name() { return g_tool; }

namespace {

// One line on stderr in a single write (MPI ranks and threads do not interleave inside it): control
// bytes and bytes outside printable ASCII escaped, cut at kMaxErrorLine characters.
void print_error_line(const char* tool_name, const std::string& what) {
  constexpr size_t kMaxErrorLine = 600;
  std::string line = std::string(tool_name) + ": error: ";
  const size_t head = line.size();
  for (unsigned char c : what) {
    if (line.size() - head >= kMaxErrorLine) {
      line += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      line += static_cast<char>(c);
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      line += b;
    }
  }
  line += '\n';
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::fflush(stderr);
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(2, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}
}  // namespace

namespace {
bool g_json = false;
std::atomic<bool> g_summary_printed{false};

// The file an error message is about: the innermost FileScope it left, else its leading "<path>: "
// when that path or its folder is on disk (a missing file is still the file meant); "" when neither.
std::string file_of(const std::string& what) {
  if (!failed_file().empty()) return failed_file();
  const auto colon = what.find(": ");
  if (colon == std::string::npos || colon == 0 || what[0] == '-') return {};
  const std::filesystem::path head = what.substr(0, colon);
  std::error_code ec;
  const bool named = std::filesystem::exists(head, ec) ||
                     (head.has_parent_path() && std::filesystem::is_directory(head.parent_path(), ec));
  return named ? head.string() : std::string();
}
}  // namespace

void set_json(bool json) { g_json = json; }
void summary_printed() { g_summary_printed = true; }

void print_error_envelope(const char* tool_name, const std::string& what, int exit_code) {
  if (!g_json || g_summary_printed.load() || launcher_rank() != 0) return;
  const std::string file = file_of(what);
  nlohmann::json error = {{"message", what}, {"exit_code", exit_code}, {"file", file.empty() ? nlohmann::json(nullptr) : nlohmann::json(file)}};
  print_json(envelope(tool_name, nullptr, {{"error", std::move(error)}}));
}

int run(const char* tool_name, const std::function<int()>& body) {
  g_tool = tool_name;
  try {
    return body();
  } catch (const UsageError& e) {
    // Every MPI rank makes the same usage error: rank 0 says it.
    if (launcher_rank() == 0) print_error_line(tool_name, e.what());
    print_error_envelope(tool_name, e.what(), kUsage);
    return kUsage;
  } catch (const ReportedElsewhere&) {
    return kFailure;  // rank 0 prints this rank's failure
  } catch (const std::exception& e) {
    print_error_line(tool_name, e.what());
    print_error_envelope(tool_name, e.what(), kFailure);
    return kFailure;
  }
}

void set_verbosity(int level) { g_verbosity = level; }
int verbosity() { return g_verbosity; }

void info(const std::string& message) {
  if (g_verbosity < 0) return;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::cerr << g_tool << ": " << message << "\n";
}

void verbose(const std::string& message) {
  if (g_verbosity < 1) return;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::cerr << g_tool << ": " << message << "\n";
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_print_mutex);
  std::cerr << g_tool << ": warning: " << message << "\n";
}

uint64_t peak_rss_bytes() { return ucpkit::peak_rss_bytes(); }

Reporter console_reporter() {
  Reporter r;
  r.warn = [](const std::string& m) { warn(m); };
  r.verbose = [](const std::string& m) { verbose(m); };
  r.progress = [](const std::string& label, uint64_t total) -> std::unique_ptr<ProgressSink> {
    return std::make_unique<Progress>(label, total);
  };
  r.phase = [](const std::string& name, Reporter::PhaseEvent event, double seconds) {
    if (g_verbosity < 1 || launcher_rank() != 0) return;
    char line[64] = "started";
    if (event != Reporter::PhaseEvent::start)
      std::snprintf(line, sizeof line, event == Reporter::PhaseEvent::end ? "%.3f s" : "stopped after %.3f s", seconds);
    verbose("phase " + name + ": " + line);
  };
  return r;
}

}  // namespace ucpkit::tool
