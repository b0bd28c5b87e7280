// Tool driver helpers.
#include "tool/tool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "core/error.h"

namespace ucpkit::tool {
namespace {
int g_verbosity = 0;
const char* g_tool = "ucpkit";
std::mutex g_print_mutex;

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

namespace {
// The rank of this process under an MPI launcher, 0 otherwise (read from the launcher's environment:
// lib/tool does not link MPI).
int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v); r && *r) return std::atoi(r);
  return 0;
}

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

int run(const char* tool_name, const std::function<int()>& body) {
  g_tool = tool_name;
  try {
    return body();
  } catch (const UsageError& e) {
    // Every MPI rank makes the same usage error: rank 0 says it.
    if (launcher_rank() == 0) print_error_line(tool_name, e.what());
    return kUsage;
  } catch (const ReportedElsewhere&) {
    return kFailure;  // rank 0 prints this rank's failure
  } catch (const std::exception& e) {
    print_error_line(tool_name, e.what());
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
  return r;
}

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(g_verbosity >= 0 && ::isatty(2)) {}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t n) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  done_ += n;
  draw(false);
}

void Progress::draw(bool force) {
  double t = now_seconds();
  if (!force && t - last_draw_ < 0.1) return;
  last_draw_ = t;
  const int width = 40;
  double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  if (frac > 1) frac = 1;
  int filled = static_cast<int>(frac * width);
  std::string bar(filled, '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r%s [%s] %3d%% (%llu/%llu)", label_.c_str(), bar.c_str(), static_cast<int>(frac * 100),
               static_cast<unsigned long long>(done_), static_cast<unsigned long long>(total_));
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  draw(true);
  std::fprintf(stderr, "\n");
  enabled_ = false;
}

}  // namespace ucpkit::tool
