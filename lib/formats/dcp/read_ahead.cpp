// Read ahead (read_ahead.h): one thread, a queue bounded in bytes, the consumer's order checked against the plan's.
#include "formats/dcp/read_ahead.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "io/dtype.h"
#include "io/shape.h"

namespace ucpkit::formats::dcp {
namespace {

uint64_t entry_bytes(const Entry& e) { return static_cast<uint64_t>(numel_of(e.size)) * dtype_size(e.dtype); }

class ReadAhead {
 public:
  ReadAhead(std::function<Tensor(const Entry&)> whole, std::vector<const Entry*> order, uint64_t max_bytes)
      : whole_(std::move(whole)), order_(std::move(order)), max_bytes_(max_bytes) {
    worker_ = std::thread([this] { run(); });
  }
  ~ReadAhead() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    reader_cv_.notify_all();
    worker_.join();
  }

  Tensor get(const Entry& e) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!ahead(e)) {  // not read ahead (large), or asked again
      lock.unlock();
      return whole_(e);
    }
    for (;;) {  // the ones before it were not asked for: dropped
      if (ready_.empty() && !finished_) {
        ++getters_waiting_;
        getter_cv_.wait(lock, [&] { return !ready_.empty() || finished_; });
        --getters_waiting_;
      }
      if (ready_.empty()) {  // the reading stopped at an error before it
        lock.unlock();
        return whole_(e);
      }
      Slot s = std::move(ready_.front());
      ready_.pop_front();
      waiting_ -= s.bytes;
      ++taken_;
      // The reader, when it waits for room, is woken once half the queue is taken (a wake per tensor was a
      // futex call on each side per tensor: 100,000 tensors, 13,000 context switches).
      if (reader_waits_ && ((ready_.size() <= kMaxWaiting / 2 && waiting_ <= max_bytes_ / 2) || ready_.empty()))
        reader_cv_.notify_one();
      if (s.entry != &e) continue;
      lock.unlock();
      if (s.error) std::rethrow_exception(s.error);
      return std::move(s.tensor);
    }
  }

 private:
  struct Slot {
    const Entry* entry = nullptr;
    Tensor tensor;
    std::exception_ptr error;
    uint64_t bytes = 0;
  };

  void run() {
    struct Finish {  // however the loop ends, get() stops waiting for more
      ReadAhead& r;
      ~Finish() {
        {
          std::lock_guard<std::mutex> lock(r.mu_);
          r.finished_ = true;
        }
        r.getter_cv_.notify_all();
      }
    } finish{*this};
    for (const Entry* e : order_) {
      const uint64_t bytes = entry_bytes(*e);
      {
        std::unique_lock<std::mutex> lock(mu_);
        auto room = [&] {
          return stop_ || ready_.empty() || (waiting_ + bytes <= max_bytes_ && ready_.size() < kMaxWaiting);
        };
        if (!room()) {
          reader_waits_ = true;
          reader_cv_.wait(lock, room);
          reader_waits_ = false;
        }
        if (stop_) return;
      }
      Slot s{e, Tensor(), nullptr, bytes};
      try {
        s.tensor = whole_(*e);
      } catch (...) {
        s.error = std::current_exception();
      }
      const bool failed = s.error != nullptr;
      bool wake = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        waiting_ += bytes;
        ready_.push_back(std::move(s));
        wake = getters_waiting_ > 0;
      }
      if (wake) getter_cv_.notify_all();
      if (failed) return;  // the error waits for its entry; nothing after it is read
    }
  }

  // Tensors waiting, at most (each holds its item's map slice and name: 10^5 tensors of 16 bytes fit in max_bytes).
  static constexpr size_t kMaxWaiting = 1024;
  std::function<Tensor(const Entry&)> whole_;
  std::vector<const Entry*> order_;
  // Whether `e` is at or after the next one ready (mu_ held). The writer asks in order: the position index is made
  // only when it asks for another.
  bool ahead(const Entry& e) {
    if (taken_ < order_.size() && order_[taken_] == &e) return true;
    if (at_.empty())
      for (size_t k = 0; k < order_.size(); ++k) at_.emplace(order_[k], k);
    const auto at = at_.find(&e);
    return at != at_.end() && at->second >= taken_;
  }

  std::unordered_map<const Entry*, size_t> at_;
  uint64_t max_bytes_;
  std::mutex mu_;
  std::condition_variable getter_cv_, reader_cv_;
  size_t getters_waiting_ = 0;
  bool reader_waits_ = false;
  std::deque<Slot> ready_;
  uint64_t waiting_ = 0;
  size_t taken_ = 0;  // slots taken (or dropped) so far: order_[taken_] is the next one ready
  bool stop_ = false;
  bool finished_ = false;  // the reading thread is done (every entry read, an error, or stopped)
  std::thread worker_;
};

}  // namespace

std::function<Tensor(const Entry&)> read_ahead(std::function<Tensor(const Entry&)> whole, std::vector<const Entry*> order,
                                               uint64_t max_bytes, uint64_t max_entry_bytes) {
  std::vector<const Entry*> small;
  for (const Entry* e : order)
    if (!e->is_bytes && entry_bytes(*e) <= max_entry_bytes) small.push_back(e);
  if (small.empty()) return whole;
  auto state = std::make_shared<ReadAhead>(std::move(whole), std::move(small), max_bytes);
  return [state](const Entry& e) { return state->get(e); };
}

std::vector<const Entry*> read_order(const SavePlan& plan) {
  std::vector<const Entry*> order;
  auto add = [&](size_t k) {
    if (k < plan.entries.size() && !plan.entries[k].is_bytes && (order.empty() || order.back() != &plan.entries[k]))
      order.push_back(&plan.entries[k]);
  };
  if (!plan.write_order.empty()) {
    for (const PlannedItem& it : plan.write_order) add(it.entry);
  } else {
    for (size_t k = 0; k < plan.entries.size(); ++k) add(k);
  }
  return order;
}

}  // namespace ucpkit::formats::dcp
