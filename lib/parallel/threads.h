// Threads inside one process: how many, and running a parallel phase on exactly that many.
#pragma once
#include <tbb/task_arena.h>

#include <utility>

namespace ucpkit::parallel {

// `requested` when positive (a tool's --threads), else every core TBB may use (at least 1).
int thread_count(int requested);

// Runs `f` (which starts TBB parallel loops) in an arena of thread_count(requested) threads.
template <class F>
void in_arena(int requested, F&& f) {
  tbb::task_arena arena(thread_count(requested));
  arena.execute(std::forward<F>(f));
}

}  // namespace ucpkit::parallel
