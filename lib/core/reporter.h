// What library code has to tell the user (issue 21): warnings, details and progress, passed in by the
// caller instead of printed by the library. The tools wire it to their console output
// (tool::console_reporter(): warnings always, details with -v, a progress bar when stderr is a
// terminal); tests capture it; a default-constructed Reporter says nothing.
#pragma once
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
  std::function<void(const std::string&)> warn;     // a warning line
  std::function<void(const std::string&)> verbose;  // a detail line (-v)
  std::function<std::unique_ptr<ProgressSink>(const std::string& label, uint64_t total)> progress;

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
};

// Peak resident set size of this process, in bytes (getrusage).
uint64_t peak_rss_bytes();

}  // namespace ucpkit
