#include "core/allocator.h"

#include <malloc.h>

namespace ucpkit {

void keep_large_buffers_on_heap(const HeapTuning& tuning) {
  if (tuning.one_arena) mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, tuning.trim_threshold);
  if (tuning.top_pad > 0) mallopt(M_TOP_PAD, tuning.top_pad);
}

}  // namespace ucpkit
