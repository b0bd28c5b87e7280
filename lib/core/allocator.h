// glibc heap tuning for tools whose large buffers come and go per parameter or per file: served
// from fresh mmaps, they are faulted in and zeroed page by page every time (the dominant cost on
// virtual machines); kept on the heap and never trimmed, each reuses the pages of the previous one.
#pragma once

namespace ucpkit {

struct HeapTuning {
  // All threads share the main arena: glibc serves large requests of the other arenas with fresh
  // mmaps whatever M_MMAP_MAX says (ucp-union's TBB workers allocate the buffers).
  bool one_arena = false;
  int trim_threshold = 1 << 30;  // M_TRIM_THRESHOLD
  int top_pad = 0;               // M_TOP_PAD (0: glibc's default)
};

// mallopt: M_MMAP_MAX 0 (no mmap for large requests), then the settings above. Process-wide; call
// at the start of a run, before the threads start.
void keep_large_buffers_on_heap(const HeapTuning& tuning);

}  // namespace ucpkit
