// What library code has to tell the user: warnings, details, progress and phases, passed in
// by the caller instead of printed by the library. The tools wire it to their console output
// (tool::console_reporter(): warnings always, details and phase times with -v, progress as a bar on a
// terminal or paced lines in a batch log); tests capture it; a default-constructed Reporter says nothing.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace ucpkit {

// A progress bar (or anything counting steps). Callers from several threads serialise through
// Reporter::Bar.
class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  virtual void advance(uint64_t n) = 0;
  virtual void finish() = 0;
};

struct Reporter {
  enum class PhaseEvent { start, end, stopped };  // stopped: left by an exception

  std::function<void(const std::string&)> warn;     // a warning line
  std::function<void(const std::string&)> verbose;  // a detail line (-v)
  std::function<std::unique_ptr<ProgressSink>(const std::string& label, uint64_t total)> progress;
  // A named phase of a long operation started, or ended after `seconds` (tools: -v lines on rank 0).
  std::function<void(const std::string& name, PhaseEvent event, double seconds)> phase;

  void warning(const std::string& line) const {
    if (warn) warn(line);
  }
  void detail(const std::string& line) const {
    if (verbose) verbose(line);
  }

  // A thread-safe bar for `total` steps, drawn only when `enabled` (rank 0) and the caller gave a
  // progress factory.
  class Bar {
   public:
    Bar(const Reporter& r, const std::string& label, uint64_t total, bool enabled = true)
        : sink_(enabled && r.progress ? r.progress(label, total) : nullptr) {}
    void advance(uint64_t n = 1) {
      if (!sink_) return;
      std::lock_guard lock(mu_);
      sink_->advance(n);
    }
    void finish() {
      if (sink_) sink_->finish();
    }

   private:
    std::mutex mu_;
    std::unique_ptr<ProgressSink> sink_;
  };

  // The main phases of one operation, one after another, each timed:
  //   Reporter::Phase phase(options.reporter, "plan");  ...  phase.next("write");  ...
  // A phase ends when the next starts and when the object goes (as "stopped" during an exception).
  class Phase {
   public:
    Phase(const Reporter& r, std::string name);
    ~Phase();
    Phase(const Phase&) = delete;
    Phase& operator=(const Phase&) = delete;
    void next(std::string name);

   private:
    void end(PhaseEvent event);
    std::function<void(const std::string&, PhaseEvent, double)> sink_;
    std::string name_;
    std::chrono::steady_clock::time_point start_;
    int exceptions_ = 0;  // std::uncaught_exceptions() when made
  };
};

// Peak resident set size of this process, in bytes (getrusage).
uint64_t peak_rss_bytes();

}  // namespace ucpkit
