// Memory a command-line tool is done with just before it exits, left for the exit to take back instead of freed
// node by node (clang's -disable-free, for the same reason): the reader and plan of a 100,000-tensor DCP took
// 0.1-0.2 s of its 1.3-s reshard to free. Off unless a tool's main turns it on, so that a test process, a library
// caller or a long-running agent frees as usual. What is kept stays reachable (a leak checker does not call it lost).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace ucpkit {
namespace exit_release_detail {

struct State {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<std::shared_ptr<const void>> kept;
};
inline State& state() {
  static State* s = new State;  // never destroyed: what it keeps must outlive every static destructor
  return *s;
}

}  // namespace exit_release_detail

// The tool's main: the process exits soon after each release() (one conversion per process).
inline void set_release_at_exit(bool on) { exit_release_detail::state().on = on; }
inline bool release_at_exit() { return exit_release_detail::state().on; }

// Drops `p`: freed now, or kept until the process exits when release_at_exit().
template <class T>
void release(std::unique_ptr<T> p) {
  if (!p) return;
  if (!release_at_exit()) return p.reset();
  auto& s = exit_release_detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.kept.emplace_back(std::move(p));
}

// How many objects are kept (tests).
inline size_t released_kept() {
  auto& s = exit_release_detail::state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.kept.size();
}

}  // namespace ucpkit
