// Progress of long work on stderr, where it is read: on a terminal a bar redrawn in place; in a batch
// log (stderr a file or a pipe) one line at most every `every` seconds once the work has run `after`
// seconds (percent, items or bytes done of the total, rate, ETA), and one line when it ends; short
// work prints nothing. Nothing under -q, and under an MPI launcher only rank 0 writes lines.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>

#include "core/reporter.h"

namespace ucpkit::tool {

enum class ProgressUnit { items, bytes };

// When lines are written in a batch log.
struct ProgressPacing {
  double after = 5;   // seconds of work before the first line: shorter work prints none
  double every = 10;  // seconds at least between two lines
  // The defaults, or UCPKIT_PROGRESS_AFTER / UCPKIT_PROGRESS_EVERY (seconds, >= 0) when set.
  static ProgressPacing from_environment();
};

// "45% (3 of 7 items), 0.5 items/s, ETA 8s" or "45% (1.2 GiB of 2.6 GiB), 120.0 MiB/s, ETA 12s";
// `seconds` is the time the work has run so far (rate and ETA "?" before any is done).
std::string progress_text(uint64_t done, uint64_t total, double seconds, ProgressUnit unit);
// "done, 7 items in 12.3 s (0.6 items/s)", or "stopped at 45% (...) after 12.3 s" when done < total.
std::string progress_end_text(uint64_t done, uint64_t total, double seconds, ProgressUnit unit);

// Which moments get a line, the clock read by the caller (tests pass their own times).
class LinePacer {
 public:
  explicit LinePacer(ProgressPacing pacing) : pacing_(pacing) {}
  // True when a line is due `elapsed` seconds into the work; it then counts as written.
  bool due(double elapsed);
  // True when the end of the work `elapsed` seconds in gets a line: a line was written, or the work
  // ran longer than `after`.
  bool end_line(double elapsed) const { return any() || elapsed >= pacing_.after; }
  bool any() const { return last_ >= 0; }  // some line was written

 private:
  ProgressPacing pacing_;
  double last_ = -1;
};

class Progress : public ProgressSink {
 public:
  Progress(std::string label, uint64_t total, ProgressUnit unit = ProgressUnit::items);
  ~Progress() override;
  void advance(uint64_t n = 1) override;
  void finish() override;

 private:
  enum class Mode { off, bar, lines };
  void draw_bar(bool force);
  std::string prefix() const;  // the label after the tool's own name: "experts: ", or ""
  std::string label_;
  uint64_t total_, done_ = 0;
  ProgressUnit unit_;
  Mode mode_;
  double start_, last_draw_ = 0;
  LinePacer pacer_;
  std::mutex mu_;
};

}  // namespace ucpkit::tool
