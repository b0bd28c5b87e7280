// Read ahead (read_ahead.h): one thread, a queue bounded in bytes, the consumer's order checked against the plan's.
#include "formats/dcp/read_ahead.h"

#include <atomic>
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

  // The caller's: the slots taken from ready_ in its last batch, each served without the lock (a lock on each side
  // per tensor was a tenth of both threads' time on a 100,000-tensor reshard, the mutex's line moving between cores).
  Tensor get(const Entry& e) {
    if (!ahead(e)) return whole_(e);                         // not read ahead (large), or asked again
    for (;;) {                                               // the ones before it were not asked for: dropped
      if (mine_.empty() && !take_ready()) return whole_(e);  // the reading stopped at an error before it
      Slot s = std::move(mine_.front());
      mine_.pop_front();
      ++taken_;
      if (s.entry != &e) continue;
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

  // Every slot ready moved to mine_ (waiting for one), the reader's room made again; false when the reading ended
  // without more.
  bool take_ready() {
    std::unique_lock<std::mutex> lock(mu_);
    if (ready_.empty() && !finished_) {
      ++getters_waiting_;
      getter_waits_.store(true, std::memory_order_relaxed);
      getter_cv_.wait(lock, [&] { return !ready_.empty() || finished_; });
      getter_waits_.store(false, std::memory_order_relaxed);
      --getters_waiting_;
    }
    if (ready_.empty()) return false;
    mine_.swap(ready_);
    waiting_ = 0;
    if (reader_waits_) reader_cv_.notify_one();
    return true;
  }

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
    // Read in batches, each put in ready_ under one lock: at most kBatch slots, an eighth of max_bytes, or what is read
    // when the caller waits (its flag read without the lock after each tensor).
    std::vector<Slot> batch;
    uint64_t batch_bytes = 0;
    auto publish = [&] {
      if (batch.empty()) return;
      bool wake = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (Slot& s : batch) ready_.push_back(std::move(s));
        waiting_ += batch_bytes;
        wake = getters_waiting_ > 0;
      }
      batch.clear();
      batch_bytes = 0;
      if (wake) getter_cv_.notify_all();
    };
    for (const Entry* e : order_) {
      const uint64_t bytes = entry_bytes(*e);
      if (batch.empty()) {  // room for a batch: checked when it starts
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
      batch.push_back(std::move(s));
      batch_bytes += bytes;
      if (failed || batch.size() >= kBatch || batch_bytes >= max_bytes_ / 8 ||
          getter_waits_.load(std::memory_order_relaxed))
        publish();
      if (failed) return;  // the error waits for its entry; nothing after it is read
    }
    publish();
  }

  // Tensors waiting when the reader starts a batch, at most (each holds its item's map slice and name: 10^5 tensors of
  // 16 bytes fit in max_bytes); the tensors of a batch, which goes into ready_ at once, at most.
  static constexpr size_t kMaxWaiting = 1024, kBatch = 64;
  std::function<Tensor(const Entry&)> whole_;
  std::vector<const Entry*> order_;
  // Whether `e` is at or after the next one ready (the caller's state: no lock). The writer asks in order: the position
  // index is made only when it asks for another.
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
  std::atomic<bool> getter_waits_{false};  // the caller waits for a slot: the reader publishes what it has
  std::deque<Slot> ready_;
  std::deque<Slot> mine_;  // the caller's (take_ready)
  uint64_t waiting_ = 0;   // bytes of ready_
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
