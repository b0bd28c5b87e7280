// Progress bar on a terminal, paced lines in a batch log.
#include "tool/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tool/tool.h"

namespace ucpkit::tool {
namespace {

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// Seconds from the environment variable `name`, or `fallback` when unset or not a number >= 0.
double seconds_from(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  return (end && *end == '\0' && std::isfinite(s) && s >= 0) ? s : fallback;
}

std::string amount(double v, ProgressUnit unit) {
  char b[48];
  if (unit == ProgressUnit::items) {
    std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  std::snprintf(b, sizeof b, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return b;
}

std::string rate(double per_second, ProgressUnit unit) {
  if (unit == ProgressUnit::bytes) return amount(per_second, unit) + "/s";
  char b[48];
  std::snprintf(b, sizeof b, per_second >= 10 ? "%.0f items/s" : "%.2f items/s", per_second);
  return b;
}

// 8s, 3m05s, 2h07m.
std::string duration_text(double s) {
  const long long t = std::llround(s);
  char b[48];
  if (t < 60)
    std::snprintf(b, sizeof b, "%llds", t);
  else if (t < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", t / 3600, t / 60 % 60);
  return b;
}

std::string of_total(uint64_t done, uint64_t total, ProgressUnit unit) {
  return amount(static_cast<double>(done), unit) + " of " + amount(static_cast<double>(total), unit) +
         (unit == ProgressUnit::items ? " items" : "");
}

int percent(uint64_t done, uint64_t total) {
  if (total == 0) return 100;
  return static_cast<int>(std::min<uint64_t>(done, total) * 100 / total);
}

}  // namespace

ProgressPacing ProgressPacing::from_environment() {
  ProgressPacing p;
  p.after = seconds_from("UCPKIT_PROGRESS_AFTER", p.after);
  p.every = seconds_from("UCPKIT_PROGRESS_EVERY", p.every);
  return p;
}

std::string progress_text(uint64_t done, uint64_t total, double seconds, ProgressUnit unit) {
  std::string s = std::to_string(percent(done, total)) + "% (" + of_total(done, total, unit) + "), ";
  if (done == 0 || seconds <= 0) return s + "rate ?, ETA ?";
  const double r = static_cast<double>(done) / seconds;
  const double left = done >= total ? 0 : static_cast<double>(total - done) / r;
  return s + rate(r, unit) + ", ETA " + duration_text(left);
}

std::string progress_end_text(uint64_t done, uint64_t total, double seconds, ProgressUnit unit) {
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", seconds);
  if (done < total)
    return "stopped at " + std::to_string(percent(done, total)) + "% (" + of_total(done, total, unit) + ") after " + secs;
  std::string s = "done, " + amount(static_cast<double>(done), unit) + (unit == ProgressUnit::items ? " items" : "") +
                  " in " + secs;
  if (seconds > 0) s += " (" + rate(static_cast<double>(done) / seconds, unit) + ")";
  return s;
}

bool LinePacer::due(double elapsed) {
  if (elapsed < pacing_.after) return false;
  if (last_ >= 0 && elapsed - last_ < pacing_.every) return false;
  last_ = elapsed;
  return true;
}

Progress::Progress(std::string label, uint64_t total, ProgressUnit unit)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      mode_(verbosity() < 0 ? Mode::off : ::isatty(2) ? Mode::bar : launcher_rank() == 0 ? Mode::lines : Mode::off),
      start_(now_seconds()),
      pacer_(ProgressPacing::from_environment()) {}

Progress::~Progress() { finish(); }

std::string Progress::prefix() const {
  std::string what = label_;
  const std::string tool = tool_name();
  if (what.compare(0, tool.size(), tool) == 0) what.erase(0, tool.size());
  while (!what.empty() && what.front() == ' ') what.erase(0, 1);
  return what.empty() ? std::string() : what + ": ";
}

void Progress::advance(uint64_t n) {
  if (mode_ == Mode::off) return;
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  if (mode_ == Mode::bar) return draw_bar(false);
  const double elapsed = now_seconds() - start_;
  if (pacer_.due(elapsed)) info(prefix() + progress_text(done_, total_, elapsed, unit_));
}

void Progress::draw_bar(bool force) {
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
  std::lock_guard<std::mutex> lock(mu_);
  if (mode_ == Mode::bar) {
    draw_bar(true);
    std::fprintf(stderr, "\n");
  } else if (const double elapsed = now_seconds() - start_;
             mode_ == Mode::lines && (done_ >= total_ ? pacer_.end_line(elapsed) : pacer_.any())) {
    // Work stopped short (an error follows) adds a line only below progress lines already written.
    info(prefix() + progress_end_text(done_, total_, elapsed, unit_));
  }
  mode_ = Mode::off;
}

}  // namespace ucpkit::tool
