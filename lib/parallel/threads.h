// Threads inside one process: how many, and running a parallel phase on exactly that many.
#pragma once
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cstddef>
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

// Runs `f` in an arena of exactly `workers` threads, more than the cores if asked: for I/O-bound
// streams whose waits overlap (TBB's default caps threads at one per core).
template <class F>
void in_io_arena(int workers, F&& f) {
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(workers));
  tbb::task_arena arena(workers);
  arena.execute(std::forward<F>(f));
}

}  // namespace ucpkit::parallel
