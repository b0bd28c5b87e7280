// Tool driver helpers.
#include "tool/tool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
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

int run(const char* tool_name, const std::function<int()>& body) {
  g_tool = tool_name;
  try {
    return body();
  } catch (const UsageError& e) {
    std::cerr << tool_name << ": error: " << e.what() << "\n";
    return kUsage;
  } catch (const std::exception& e) {
    std::cerr << tool_name << ": error: " << e.what() << "\n";
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

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
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
