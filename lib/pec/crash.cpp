// Fault injection hook.
#include "pec/crash.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace ucpkit::pec {
namespace {
std::atomic<long> g_passed{0};
long crash_after() {
  static const long n = [] {
    const char* v = std::getenv("UCPKIT_PEC_CRASH_AFTER");
    return v ? std::atol(v) : 0L;
  }();
  return n;
}
}  // namespace

void crash_point(const char* what) {
  long n = ++g_passed;
  if (crash_after() > 0 && n == crash_after()) {
    std::fprintf(stderr, "pec: fault injection: killed at crash point %ld (%s)\n", n, what);
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
    ::_exit(137);
  }
}

long crash_points_passed() { return g_passed.load(); }

}  // namespace ucpkit::pec
