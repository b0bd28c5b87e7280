// Redundancy-bypassing load, executed: owners read, one all-to-all per batch, out-of-order writes.
// The plan (exchange_plan.h) says who writes which file and reads which unit in which batch; this
// rank's part of it (fill pieces, RankBatches) is plain data too; ExchangeRun carries it out step by
// step, every step collective (a failure on one rank stops all at the next step).
#include "reshard/exchange.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <tuple>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/crc32.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"

namespace ucpkit::reshard {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One piece of a reserved record to fill: bytes [begin, end) of record `record` of file `file`.
struct Item {
  size_t file, record;
  uint64_t begin, end;
};

// A float buffer left uninitialized (it is always written before it is read).
std::unique_ptr<float[]> floats(uint64_t n) { return std::make_unique_for_overwrite<float[]>(std::max<uint64_t>(n, 1)); }

// The exchange on this rank, in the order run_exchange calls the steps.
class ExchangeRun {
 public:
  ExchangeRun(UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan, parallel::MpiSession& mpi,
              int threads)
      : reader_(reader), model_(model), plan_(plan), mpi_(mpi), me_(mpi.rank()),
        nranks_(mpi.size()), arena_(threads) {}
  ~ExchangeRun() {
    if (cache_set_) reader_.set_cache(nullptr);
  }

  void create_files(const std::vector<LaidOutFile>& laid_out, const WriteOptions& options);
  void cut_fill_steps();
  void measure_fill_balance();
  void gather_needs();
  void allocate_buffers();
  void run_batches(const Reporter& reporter);
  void finish();
  ExchangeStats stats;

 private:
  void fill(size_t step);
  std::vector<size_t> read_batch(size_t b);
  void verify_tensors(const std::vector<size_t>& complete);
  void pack_batch(size_t b);
  void cache_batch(size_t b);
  float* owned_data(const RankBatches::Batch& x, size_t i) const { return owned_buf_.get() + x.owned_at[i]; }
  size_t tensor_of(const ExchangePlan::Read& rd) const { return tensor_index(model_, rd.param, rd.state); }

  UniversalReader& reader_;
  const ModelInfo& model_;
  const ExchangePlan& plan_;
  parallel::MpiSession& mpi_;
  const int me_, nranks_;
  tbb::task_arena arena_;
  std::vector<std::unique_ptr<DeferredTorchFile>> files_;  // this rank's
  std::vector<const LaidOutFile*> laid_out_;               // the same files as laid out (their sources)
  std::vector<std::vector<Item>> items_;                   // per fill step: [0] zeros; [b + 1] batch b
  AtomicNeeds mine_;                                       // what this rank's files need
  std::vector<AtomicNeeds> needs_;                         // every rank's
  RankBatches batches_;
  std::unique_ptr<float[]> owned_buf_, send_buf_, recv_buf_;
  AtomicCache cache_;
  bool cache_set_ = false;
  std::vector<uint32_t> unit_crc_;   // every unit's CRC, from whichever rank read it
  std::vector<size_t> units_left_;   // per tensor: units not read yet
};

// 1. This rank's files (the plan says who writes which): pickles written, generated records reserved.
void ExchangeRun::create_files(const std::vector<LaidOutFile>& laid_out, const WriteOptions& options) {
  if (plan_.file_ranks.size() != laid_out.size()) throw Error("exchange plan made for other files");
  std::vector<size_t> mine_of;
  for (size_t f = 0; f < laid_out.size(); ++f)
    if (plan_.file_ranks[f] == me_) mine_of.push_back(f);
  files_.resize(mine_of.size());
  for (size_t f : mine_of) laid_out_.push_back(&laid_out[f]);
  const TorchSaveOptions save{.start_writeback = options.start_writeback};
  parallel::collectively(mpi_, [&] {
    arena_.execute([&] {
      tbb::parallel_for(size_t{0}, mine_of.size(), [&](size_t i) {
        check_interrupted();
        files_[i] = std::make_unique<DeferredTorchFile>(laid_out_[i]->path, laid_out_[i]->root, save);
      });
    });
  });
  stats.files_written = files_.size();
}

// 2. What this rank writes: every reserved record of its files cut into pieces by fill step, and
//    the atomic elements those pieces need.
void ExchangeRun::cut_fill_steps() {
  items_.assign(plan_.batches.size() + 1, {});
  parallel::collectively(mpi_, [&] {
    for (size_t f = 0; f < files_.size(); ++f) {
      const auto& records = files_[f]->records();
      for (size_t k = 0; k < records.size(); ++k) {
        const Storage& st = *records[k].storage;
        const auto& sources = laid_out_[f]->sources_of(&st);
        for (const FillPiece& p : fill_pieces(sources, dtype_size(st.dtype()), st.nbytes(), model_, plan_))
          items_[p.step].push_back({f, k, p.begin, p.end});
        add_needs(model_, sources, st.dtype(), mine_);
      }
    }
    normalize_needs(mine_);
  });
}

// How evenly the ranks' fill steps are loaded (ExchangeStats::fill_cost, one all-gather).
void ExchangeRun::measure_fill_balance() {
  std::vector<int64_t> step_bytes(items_.size(), 0);
  for (size_t s = 0; s < items_.size(); ++s)
    for (const Item& it : items_[s]) step_bytes[s] += static_cast<int64_t>(it.end - it.begin);
  std::tie(stats.fill_cost, stats.fill_cost_even) = fill_costs(mpi_.allgather(step_bytes));
}

// 3. Everyone's needs, so that owners know what to send where (once, before the batches).
void ExchangeRun::gather_needs() {
  const auto all = mpi_.allgather(flatten_needs(mine_));
  needs_.clear();
  for (int r = 0; r < nranks_; ++r) needs_.push_back(unflatten_needs(all[static_cast<size_t>(r)]));
  batches_ = plan_rank_batches(plan_, needs_, me_);
}

// The read, send and receive buffers, allocated once for the largest batch and left uninitialized
// (fresh pages every batch, a page fault and a zero-fill each, cost more than the copies). On every
// rank before any transfer (MPI's int counts checked too), so that a failure here stops all ranks
// instead of leaving the others in an all-to-all.
void ExchangeRun::allocate_buffers() {
  parallel::collectively(mpi_, [&] {
    if (std::max(batches_.max_send, batches_.max_recv) > static_cast<uint64_t>(INT32_MAX))
      throw Error("MPI exchange batch too large (more than 2^31 floats to send or receive on one rank); lower --batch-mb");
    owned_buf_ = floats(batches_.max_owned), send_buf_ = floats(batches_.max_send), recv_buf_ = floats(batches_.max_recv);
  });
}

// Fills the pieces of fill step `step` window by window. One thread per file at a time: buffered
// writes to one file serialize on its inode lock (threads writing the same file spun on it: 18% of the time).
void ExchangeRun::fill(size_t step) {
  constexpr uint64_t kWindow = 1u << 20;  // generated, checksummed and written while in the CPU cache
  std::vector<std::vector<Item>> per_file(files_.size());
  for (const Item& it : items_[step]) per_file[it.file].push_back(it);
  std::vector<size_t> order;
  for (size_t f = 0; f < per_file.size(); ++f)
    if (!per_file[f].empty()) order.push_back(f);
  arena_.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, order.size(), 1),
        [&](const tbb::blocked_range<size_t>& range) {
          thread_local std::vector<uint8_t> window;
          for (size_t o = range.begin(); o != range.end(); ++o)
            for (const Item& it : per_file[order[o]]) {
              const Storage& st = *files_[it.file]->records()[it.record].storage;
              const uint64_t es = dtype_size(st.dtype());
              const uint64_t chunk = std::max<uint64_t>(es, kWindow / es * es);
              for (uint64_t a = it.begin; a < it.end; a += chunk) {
                const size_t n = static_cast<size_t>(std::min(it.end, a + chunk) - a);
                if (window.size() < n) window.resize(n);
                std::span<uint8_t> w(window.data(), n);
                st.generate(a, w);
                files_[it.file]->write(it.record, a, w);
              }
            }
        },
        tbb::simple_partitioner());
  });
}

// 4. Owners read their units of batch `b` (checksum in the same pass, every unit in parts of 8 MiB,
//    all at once; the parts' CRCs combined in order). The units' CRCs go to every rank; returns the
//    tensors whose last unit was read in this batch.
std::vector<size_t> ExchangeRun::read_batch(size_t b) {
  const auto& x = batches_.batches[b];
  auto numel = [&](size_t i) { return static_cast<int64_t>(x.owned_at[i + 1] - x.owned_at[i]); };
  std::vector<uint32_t> crcs(x.owned.size(), 0);
  parallel::collectively(mpi_, [&] {
    check_interrupted();  // SIGINT/SIGTERM: every rank stops at the start of the next batch
    constexpr int64_t kPart = 2 << 20;              // elements
    std::vector<std::pair<size_t, int64_t>> parts;  // (owned index, first element in the unit)
    for (size_t i = 0; i < x.owned.size(); ++i)
      for (int64_t a = 0; a < numel(i) || a == 0; a += kPart) parts.emplace_back(i, a);
    std::vector<uint32_t> part_crcs(parts.size(), 0);
    arena_.execute([&] {
      tbb::parallel_for(size_t{0}, parts.size(), [&](size_t p) {
        const auto [i, a] = parts[p];
        const auto& rd = plan_.reads[x.owned[i]];
        const int64_t n = std::min<int64_t>(kPart, numel(i) - a);
        part_crcs[p] = reader_.read_part(rd.param, model_.states[static_cast<size_t>(rd.state)], rd.start + a, n,
                                         owned_data(x, i) + a);
      });
    });
    for (size_t p = 0; p < parts.size(); ++p) {
      const auto [i, a] = parts[p];
      const int64_t n = std::min<int64_t>(kPart, numel(i) - a);
      crcs[i] = a == 0 ? part_crcs[p] : crc32_combine(crcs[i], part_crcs[p], static_cast<uint64_t>(n) * 4);
    }
  });
  std::vector<int64_t> mine_crcs;
  for (size_t i = 0; i < x.owned.size(); ++i)
    mine_crcs.insert(mine_crcs.end(), {static_cast<int64_t>(x.owned[i]), static_cast<int64_t>(crcs[i])});
  std::vector<size_t> complete;
  for (const auto& from : mpi_.allgather(mine_crcs))
    for (size_t i = 0; i + 1 < from.size(); i += 2) {
      const auto u = static_cast<size_t>(from[i]);
      unit_crc_[u] = static_cast<uint32_t>(from[i + 1]);
      if (--units_left_[tensor_of(plan_.reads[u])] == 0) complete.push_back(tensor_of(plan_.reads[u]));
    }
  return complete;
}

// The owner of the first unit of each `complete` tensor combines its units' CRCs in order and checks
// the manifest's (each atomic byte is read once in all).
void ExchangeRun::verify_tensors(const std::vector<size_t>& complete) {
  parallel::collectively(mpi_, [&] {
    for (size_t tensor : complete) {
      const size_t u0 = plan_.first_unit[tensor], u1 = plan_.first_unit[tensor + 1];
      if (plan_.reads[u0].owner != me_) continue;
      uint32_t crc = unit_crc_[u0];
      for (size_t u = u0 + 1; u < u1; ++u) crc = crc32_combine(crc, unit_crc_[u], plan_.reads[u].bytes);
      const auto& rd = plan_.reads[u0];
      reader_.verify_whole(rd.param, model_.states[static_cast<size_t>(rd.state)], crc);
    }
  });
}

// 5. The send buffer of batch `b`: for every other rank, the intervals it needs of every unit read
//    here, in batch order (this rank's own needs are served from its read buffer, not copied).
void ExchangeRun::pack_batch(size_t b) {
  const auto& x = batches_.batches[b];
  std::vector<uint64_t> send_at(static_cast<size_t>(nranks_) + 1, 0);
  std::partial_sum(x.send_counts.begin(), x.send_counts.end(), send_at.begin() + 1);
  arena_.execute([&] {
    tbb::parallel_for(0, nranks_, [&](int r) {
      if (r == me_) return;
      float* out = send_buf_.get() + send_at[r];
      for (size_t i = 0; i < x.owned.size(); ++i) {
        const auto& rd = plan_.reads[x.owned[i]];
        for_each_needed(needs_[static_cast<size_t>(r)], rd, [&](int64_t start, int64_t count) {
          std::memcpy(out, owned_data(x, i) + (start - rd.start), static_cast<size_t>(count) * 4);
          out += count;
        });
      }
    });
  });
}

// 6. The received intervals of batch `b` (and this rank's own reads) become the reader's cache.
void ExchangeRun::cache_batch(size_t b) {
  const auto& x = batches_.batches[b];
  cache_.clear();
  std::vector<uint64_t> recv_at(static_cast<size_t>(nranks_) + 1, 0);
  std::partial_sum(x.recv_counts.begin(), x.recv_counts.end(), recv_at.begin() + 1);
  size_t own = 0;
  for (size_t k : plan_.batches[b]) {
    const auto& rd = plan_.reads[k];
    const float* mine_data = rd.owner == me_ ? owned_data(x, own++) : nullptr;
    for_each_needed(needs_[static_cast<size_t>(me_)], rd, [&](int64_t start, int64_t count) {
      if (mine_data) {
        cache_.add(rd.param, rd.state, start, count, mine_data + (start - rd.start));
      } else {
        cache_.add(rd.param, rd.state, start, count, recv_buf_.get() + recv_at[rd.owner]);
        recv_at[rd.owner] += static_cast<uint64_t>(count);
      }
    });
  }
}

// Fill step 0 (zeros), then per batch: read and verify, pack, one all-to-all, cache, fill its step.
void ExchangeRun::run_batches(const Reporter& reporter) {
  reader_.set_cache(&cache_);  // from here on read_range never touches the files
  cache_set_ = true;
  {
    const auto t = Clock::now();
    parallel::collectively(mpi_, [&] { fill(0); });
    stats.fill_seconds += since(t);
  }
  unit_crc_.assign(plan_.reads.size(), 0);
  units_left_.resize(plan_.first_unit.size() - 1);
  for (size_t t = 0; t < units_left_.size(); ++t) units_left_[t] = plan_.first_unit[t + 1] - plan_.first_unit[t];
  Reporter::Bar progress(reporter, "ucp-load", plan_.batches.size());
  for (size_t b = 0; b < plan_.batches.size(); ++b) {
    const auto& x = batches_.batches[b];
    auto t = Clock::now();
    verify_tensors(read_batch(b));
    stats.read_seconds += since(t);
    t = Clock::now();
    pack_batch(b);
    stats.pack_seconds += since(t);
    t = Clock::now();
    mpi_.alltoallv(send_buf_.get(), x.send_counts, recv_buf_.get(), x.recv_counts);
    stats.alltoall_seconds += since(t);
    cache_batch(b);
    t = Clock::now();
    parallel::collectively(mpi_, [&] { fill(b + 1); });
    stats.fill_seconds += since(t);
    cache_.clear();
    if (me_ == 0) progress.advance();
  }
  progress.finish();
  if (std::any_of(units_left_.begin(), units_left_.end(), [](size_t n) { return n > 0; }))
    throw Error("internal error: an atomic tensor was not read whole");
}

// 7. Checksums combined, central directories written, files renamed into place.
void ExchangeRun::finish() {
  const auto t = Clock::now();
  std::atomic<uint64_t> written{0};
  parallel::collectively(mpi_, [&] {
    arena_.execute([&] {
      tbb::parallel_for(size_t{0}, files_.size(), [&](size_t f) { written += files_[f]->finish(); });
    });
  });
  stats.finish_seconds = since(t);
  stats.bytes_written = written.load();
}

}  // namespace

ExchangeStats run_exchange(const std::vector<LaidOutFile>& laid_out, const WriteOptions& options,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           parallel::MpiSession& mpi, int threads, const Reporter& reporter) {
  if (plan.ranks != mpi.size()) throw Error("exchange plan made for " + std::to_string(plan.ranks) + " ranks");
  ExchangeRun run(reader, model, plan, mpi, threads);
  run.create_files(laid_out, options);
  run.cut_fill_steps();
  run.measure_fill_balance();
  run.gather_needs();
  run.allocate_buffers();
  run.run_batches(reporter);
  run.finish();
  return run.stats;
}

}  // namespace ucpkit::reshard
