#include "core/reporter.h"

#include <sys/resource.h>

#include <exception>

namespace ucpkit {

Reporter::Phase::Phase(const Reporter& r, std::string name)
    : sink_(r.phase), name_(std::move(name)), start_(std::chrono::steady_clock::now()),
      exceptions_(std::uncaught_exceptions()) {
  if (sink_) sink_(name_, PhaseEvent::start, 0);
}

Reporter::Phase::~Phase() {
  end(std::uncaught_exceptions() > exceptions_ ? PhaseEvent::stopped : PhaseEvent::end);
}

void Reporter::Phase::next(std::string name) {
  end(PhaseEvent::end);
  name_ = std::move(name);
  start_ = std::chrono::steady_clock::now();
  if (sink_) sink_(name_, PhaseEvent::start, 0);
}

void Reporter::Phase::end(PhaseEvent event) {
  if (!sink_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  try {
    sink_(name_, event, s);
  } catch (...) {  // reporting never fails the work (and never throws from a destructor)
  }
}

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace ucpkit
