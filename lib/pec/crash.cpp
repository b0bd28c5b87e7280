// Fault injection hook.
#include "pec/crash.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ucpkit::pec {
namespace {
std::atomic<long> g_passed{0};
long env_count(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atol(v) : 0L;
}
long crash_after() {
  static const long n = env_count("UCPKIT_PEC_CRASH_AFTER");
  return n;
}
long fail_after() {
  static const long n = env_count("UCPKIT_PEC_FAIL_AFTER");
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
  if (fail_after() > 0 && n == fail_after())
    throw Error(std::string("fault injection: failed at crash point ") + std::to_string(n) + " (" + what + ")");
}

}  // namespace ucpkit::pec
