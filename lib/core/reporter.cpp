#include "core/reporter.h"

#include <sys/resource.h>

namespace ucpkit {

uint64_t peak_rss_bytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

}  // namespace ucpkit
