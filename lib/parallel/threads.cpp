// Thread counts.
#include "parallel/threads.h"

#include <algorithm>

namespace ucpkit::parallel {

int thread_count(int requested) { return requested > 0 ? requested : std::max(1, tbb::this_task_arena::max_concurrency()); }

}  // namespace ucpkit::parallel
