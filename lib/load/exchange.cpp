// Redundancy-bypassing load: owners read, one all-to-all per batch, out-of-order writes.
#include "load/exchange.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <numeric>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/crc32.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/torch/torch_file.h"
#include "parallel/mpi_session.h"
#include "parallel/share.h"
#include "parallel/threads.h"
#include "ucp/plan.h"

namespace ucpkit::load {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One piece of a reserved record to fill: bytes [begin, end) of record `record` of file `file`.
struct Item {
  size_t file, record;
  uint64_t begin, end;
};

}  // namespace

namespace {

// Calls f(start, count) for the parts of the sorted, merged intervals `v` inside [a, b).
template <class F>
void for_each_overlap(const std::vector<std::pair<int64_t, int64_t>>& v, int64_t a, int64_t b, F&& f) {
  auto it = std::upper_bound(v.begin(), v.end(), a, [](int64_t x, const auto& iv) { return x < iv.first; });
  if (it != v.begin()) --it;
  for (; it != v.end() && it->first < b; ++it) {
    const int64_t lo = std::max(a, it->first), hi = std::min(b, it->first + it->second);
    if (lo < hi) f(lo, hi - lo);
  }
}

}  // namespace

namespace {

// The pieces of a generated storage to fill: its sources' byte ranges cut where their atomic
// elements move to a unit of another batch, each tagged with the fill step of that batch (b + 1),
// and the gaps between sources (zeros, step 0). Padding rows inside a source go with the piece
// they follow (step 0 when a source starts with them).
template <class F>
void for_each_piece(const Storage& st, const DeepSpeedWriter& writer, const ModelInfo& model,
                    const ExchangePlan& plan, F&& piece) {
  const auto sources = writer.sources_of(&st);  // sorted by byte_begin
  const uint64_t es = dtype_size(st.dtype());
  uint64_t at = 0;
  for (const auto& s : sources) {
    if (s.byte_begin > at) piece(size_t{0}, at, s.byte_begin);
    const size_t t = tensor_index(model, s.slot->param, s.state);
    const int64_t n = static_cast<int64_t>((s.byte_end - s.byte_begin) / es);
    size_t step = 0;
    uint64_t begin = s.byte_begin;
    bool started = false;
    for_each_run(model.params[s.slot->param].shape, s.slot->slice, s.param_offset, s.param_offset + n,
                 [&](int64_t src, int64_t count, int64_t out) {
                   if (src < 0) {
                     started = true;
                     return;
                   }
                   for (int64_t done = 0; done < count;) {
                     const int64_t e = src + done, k = e / plan.unit_elements;
                     const size_t u = plan.first_unit[t] + static_cast<size_t>(k);
                     const size_t here = static_cast<size_t>(plan.reads[u].batch) + 1;
                     const uint64_t pos = s.byte_begin + static_cast<uint64_t>(out + done) * es;
                     if (!started) {
                       step = here;
                       started = true;
                     } else if (here != step) {
                       if (pos > begin) piece(step, begin, pos);
                       begin = pos;
                       step = here;
                     }
                     done += std::min(count - done, (k + 1) * plan.unit_elements - e);
                   }
                 });
    if (s.byte_end > begin) piece(step, begin, s.byte_end);
    at = std::max(at, s.byte_end);
  }
  if (at < st.nbytes()) piece(size_t{0}, at, st.nbytes());
}

// A float buffer left uninitialized (it is always written before it is read).
std::unique_ptr<float[]> floats(uint64_t n) { return std::make_unique_for_overwrite<float[]>(std::max<uint64_t>(n, 1)); }

}  // namespace

ExchangeStats run_exchange(const std::vector<LaidOutFile>& laid_out, const DeepSpeedWriter& writer,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           parallel::MpiSession& mpi, int threads, const Reporter& reporter) {
  ExchangeStats stats;
  const int me = mpi.rank(), nranks = mpi.size();
  if (plan.ranks != nranks) throw Error("exchange plan made for " + std::to_string(plan.ranks) + " ranks");
  tbb::task_arena arena(threads);
  const size_t steps = plan.batches.size() + 1;  // fill steps: [0] zeros; [b + 1] batch b

  // 1. This rank's files (the plan says who writes which).
  if (plan.file_ranks.size() != laid_out.size()) throw Error("exchange plan made for other files");
  std::vector<size_t> mine_of;
  for (size_t f = 0; f < laid_out.size(); ++f)
    if (plan.file_ranks[f] == me) mine_of.push_back(f);
  std::vector<std::unique_ptr<DeferredTorchFile>> files(mine_of.size());
  parallel::collectively(mpi, [&] {
    arena.execute([&] {
      tbb::parallel_for(size_t{0}, mine_of.size(), [&](size_t i) {
        check_interrupted();
        files[i] = std::make_unique<DeferredTorchFile>(laid_out[mine_of[i]].path, laid_out[mine_of[i]].root);
      });
    });
  });
  stats.files_written = files.size();

  // 2. What this rank writes: every reserved record of its files cut into pieces by fill step, and
  //    the atomic elements those pieces need.
  std::vector<std::vector<Item>> items(steps);
  AtomicNeeds mine;
  parallel::collectively(mpi, [&] {
    for (size_t f = 0; f < files.size(); ++f) {
      const auto& records = files[f]->records();
      for (size_t k = 0; k < records.size(); ++k) {
        const Storage& st = *records[k].storage;
        for_each_piece(st, writer, model, plan,
                       [&](size_t step, uint64_t a, uint64_t b) { items[step].push_back({f, k, a, b}); });
        add_needs(model, writer.sources_of(&st), st.dtype(), mine);
      }
    }
    normalize_needs(mine);
  });
  {
    std::vector<int64_t> step_bytes(steps, 0);
    for (size_t s = 0; s < steps; ++s)
      for (const Item& it : items[s]) step_bytes[s] += static_cast<int64_t>(it.end - it.begin);
    const auto all = mpi.allgather(step_bytes);
    for (size_t s = 0; s < steps; ++s) {
      uint64_t top = 0, sum = 0;
      for (const auto& r : all) {
        top = std::max(top, static_cast<uint64_t>(r.at(s)));
        sum += static_cast<uint64_t>(r.at(s));
      }
      stats.fill_cost += top;
      stats.fill_cost_even += (sum + static_cast<uint64_t>(nranks) - 1) / static_cast<uint64_t>(nranks);
    }
  }

  // 3. Everyone's needs, so that owners know what to send where (once, before the batches).
  std::vector<AtomicNeeds> needs(static_cast<size_t>(nranks));
  {
    std::vector<int64_t> flat;
    for (const auto& [key, v] : mine)
      for (const auto& [start, count] : v) flat.insert(flat.end(), {key.first, key.second, start, count});
    const auto all = mpi.allgather(flat);
    for (int r = 0; r < nranks; ++r) {
      const auto& a = all[static_cast<size_t>(r)];
      for (size_t i = 0; i + 3 < a.size(); i += 4)
        needs[static_cast<size_t>(r)][{static_cast<int>(a[i]), static_cast<int>(a[i + 1])}].emplace_back(a[i + 2],
                                                                                                         a[i + 3]);
    }
  }
  // Calls f(start, count) for the elements of unit `rd` that `rank` needs (in increasing order).
  auto each_needed = [&](int rank, const ExchangePlan::Read& rd, auto&& f) {
    const auto& m = needs[static_cast<size_t>(rank)];
    auto it = m.find({rd.param, rd.state});
    if (it != m.end()) for_each_overlap(it->second, rd.start, rd.start + rd.count, f);
  };
  auto count_of = [&](int rank, const ExchangePlan::Read& rd) {
    uint64_t n = 0;
    each_needed(rank, rd, [&](int64_t, int64_t count) { n += static_cast<uint64_t>(count); });
    return n;
  };

  // Per batch: the units this rank owns, what it sends to and receives from each rank. The three
  // buffers are allocated once, for the largest batch, and left uninitialized: fresh pages every
  // batch (a page fault and a zero-fill each) cost more than the copies themselves.
  struct BatchIo {
    std::vector<size_t> owned;                   // indices into plan.reads
    std::vector<uint64_t> owned_at;              // float offset of each in the read buffer (+ end)
    std::vector<uint64_t> send_counts, recv_counts;
  };
  std::vector<BatchIo> io(plan.batches.size());
  uint64_t max_owned = 0, max_send = 0, max_recv = 0;
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    auto& x = io[b];
    x.send_counts.assign(static_cast<size_t>(nranks), 0);
    x.recv_counts.assign(static_cast<size_t>(nranks), 0);
    x.owned_at.push_back(0);
    for (size_t k : plan.batches[b]) {
      const auto& rd = plan.reads[k];
      if (rd.owner == me) {
        x.owned.push_back(k);
        x.owned_at.push_back(x.owned_at.back() + rd.bytes / 4);
        for (int r = 0; r < nranks; ++r)
          if (r != me) x.send_counts[static_cast<size_t>(r)] += count_of(r, rd);
      } else {
        x.recv_counts[static_cast<size_t>(rd.owner)] += count_of(me, rd);
      }
    }
    max_owned = std::max(max_owned, x.owned_at.back());
    max_send = std::max(max_send, std::accumulate(x.send_counts.begin(), x.send_counts.end(), uint64_t{0}));
    max_recv = std::max(max_recv, std::accumulate(x.recv_counts.begin(), x.recv_counts.end(), uint64_t{0}));
  }
  // Allocated (and MPI's int counts checked) on every rank before any transfer, so that a failure
  // here stops all ranks instead of leaving the others in an all-to-all.
  std::unique_ptr<float[]> owned_buf, send_buf, recv_buf;
  parallel::collectively(mpi, [&] {
    if (std::max(max_send, max_recv) > static_cast<uint64_t>(INT32_MAX))
      throw Error("MPI exchange batch too large (more than 2^31 floats to send or receive on one rank); lower --batch-mb");
    owned_buf = floats(max_owned), send_buf = floats(max_send), recv_buf = floats(max_recv);
  });

  // Fills the pieces in `list` window by window. One thread per file at a time: buffered writes to
  // one file serialize on its inode lock (threads writing the same file spun on it: 18% of the time).
  constexpr uint64_t kWindow = 8u << 20;
  auto fill = [&](const std::vector<Item>& list) {
    std::vector<std::vector<Item>> per_file(files.size());
    for (const Item& it : list) per_file[it.file].push_back(it);
    std::vector<size_t> order;
    for (size_t f = 0; f < per_file.size(); ++f)
      if (!per_file[f].empty()) order.push_back(f);
    arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, order.size(), 1),
          [&](const tbb::blocked_range<size_t>& range) {
            thread_local std::vector<uint8_t> window;
            for (size_t o = range.begin(); o != range.end(); ++o)
              for (const Item& it : per_file[order[o]]) {
                const Storage& st = *files[it.file]->records()[it.record].storage;
                const uint64_t es = dtype_size(st.dtype());
                const uint64_t step = std::max<uint64_t>(es, kWindow / es * es);
                for (uint64_t a = it.begin; a < it.end; a += step) {
                  const size_t n = static_cast<size_t>(std::min(it.end, a + step) - a);
                  if (window.size() < n) window.resize(n);
                  std::span<uint8_t> w(window.data(), n);
                  st.generate(a, w);
                  files[it.file]->write(it.record, a, w);
                }
              }
          },
          tbb::simple_partitioner());
    });
  };

  AtomicCache cache;
  reader.set_cache(&cache);  // from here on read_range never touches the files
  struct Reset {
    UniversalReader& r;
    ~Reset() { r.set_cache(nullptr); }
  } reset{reader};
  {
    const auto t = Clock::now();
    parallel::collectively(mpi, [&] { fill(items[0]); });
    stats.fill_seconds += since(t);
  }

  std::vector<uint32_t> unit_crc(plan.reads.size(), 0);  // every unit's CRC, from whichever rank read it
  std::vector<size_t> units_left(plan.first_unit.size() - 1);  // per tensor: units not read yet
  for (size_t t = 0; t < units_left.size(); ++t) units_left[t] = plan.first_unit[t + 1] - plan.first_unit[t];
  auto tensor_of = [&](const ExchangePlan::Read& rd) { return tensor_index(model, rd.param, rd.state); };
  Reporter::Bar progress(reporter, "ucp-load", plan.batches.size());
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    const auto& x = io[b];
    auto data = [&](size_t i) { return owned_buf.get() + x.owned_at[i]; };
    auto numel = [&](size_t i) { return static_cast<int64_t>(x.owned_at[i + 1] - x.owned_at[i]); };
    // 4. Owners read their units of the batch (checksum in the same pass). The units' CRCs go to
    //    every rank; once all units of a tensor have been read, the owner of its first unit combines
    //    them in order and checks the manifest's CRC (each atomic byte is read once in all).
    auto t = Clock::now();
    std::vector<uint32_t> crcs(x.owned.size(), 0);
    parallel::collectively(mpi, [&] {
      check_interrupted();  // SIGINT/SIGTERM: every rank stops at the start of the next batch
      // Every unit in parts of 8 MiB, all at once; the parts' CRCs are combined in order.
      constexpr int64_t kPart = 2 << 20;  // elements
      std::vector<std::pair<size_t, int64_t>> parts;  // (owned index, first element in the unit)
      for (size_t i = 0; i < x.owned.size(); ++i)
        for (int64_t a = 0; a < numel(i) || a == 0; a += kPart) parts.emplace_back(i, a);
      std::vector<uint32_t> part_crcs(parts.size(), 0);
      arena.execute([&] {
        tbb::parallel_for(size_t{0}, parts.size(), [&](size_t p) {
          const auto [i, a] = parts[p];
          const auto& rd = plan.reads[x.owned[i]];
          const int64_t n = std::min<int64_t>(kPart, numel(i) - a);
          part_crcs[p] = reader.read_part(rd.param, model.states[static_cast<size_t>(rd.state)], rd.start + a, n,
                                          data(i) + a);
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
    std::vector<size_t> complete;  // tensors whose last unit was read in this batch
    for (const auto& from : mpi.allgather(mine_crcs))
      for (size_t i = 0; i + 1 < from.size(); i += 2) {
        const auto u = static_cast<size_t>(from[i]);
        unit_crc[u] = static_cast<uint32_t>(from[i + 1]);
        if (--units_left[tensor_of(plan.reads[u])] == 0) complete.push_back(tensor_of(plan.reads[u]));
      }
    parallel::collectively(mpi, [&] {
      for (size_t tensor : complete) {
        const size_t u0 = plan.first_unit[tensor], u1 = plan.first_unit[tensor + 1];
        if (plan.reads[u0].owner != me) continue;  // the owner of the first unit checks it
        uint32_t crc = unit_crc[u0];
        for (size_t u = u0 + 1; u < u1; ++u) crc = crc32_combine(crc, unit_crc[u], plan.reads[u].bytes);
        const auto& rd = plan.reads[u0];
        reader.verify_whole(rd.param, model.states[static_cast<size_t>(rd.state)], crc);
      }
    });
    stats.read_seconds += since(t);
    // 5. One all-to-all: for every other rank, the intervals it needs of every tensor read here, in
    //    batch order (this rank's own needs are served from its read buffer, not copied).
    t = Clock::now();
    std::vector<uint64_t> send_at(static_cast<size_t>(nranks) + 1, 0);
    std::partial_sum(x.send_counts.begin(), x.send_counts.end(), send_at.begin() + 1);
    arena.execute([&] {
      tbb::parallel_for(0, nranks, [&](int r) {
        if (r == me) return;
        float* out = send_buf.get() + send_at[r];
        for (size_t i = 0; i < x.owned.size(); ++i) {
          const auto& rd = plan.reads[x.owned[i]];
          each_needed(r, rd, [&](int64_t start, int64_t count) {
            std::memcpy(out, data(i) + (start - rd.start), static_cast<size_t>(count) * 4);
            out += count;
          });
        }
      });
    });
    stats.pack_seconds += since(t);
    t = Clock::now();
    mpi.alltoallv(send_buf.get(), x.send_counts, recv_buf.get(), x.recv_counts);
    stats.alltoall_seconds += since(t);
    // 6. The received intervals (and this rank's own reads) become the cache; this rank's pieces of
    //    the batch are written.
    cache.clear();
    std::vector<uint64_t> recv_at(static_cast<size_t>(nranks) + 1, 0);
    std::partial_sum(x.recv_counts.begin(), x.recv_counts.end(), recv_at.begin() + 1);
    size_t own = 0;
    for (size_t k : plan.batches[b]) {
      const auto& rd = plan.reads[k];
      const float* mine_data = rd.owner == me ? data(own++) : nullptr;
      each_needed(me, rd, [&](int64_t start, int64_t count) {
        if (mine_data) {
          cache.add(rd.param, rd.state, start, count, mine_data + (start - rd.start));
        } else {
          cache.add(rd.param, rd.state, start, count, recv_buf.get() + recv_at[rd.owner]);
          recv_at[rd.owner] += static_cast<uint64_t>(count);
        }
      });
    }
    t = Clock::now();
    parallel::collectively(mpi, [&] { fill(items[b + 1]); });
    stats.fill_seconds += since(t);
    cache.clear();
    if (me == 0) progress.advance();
  }
  progress.finish();
  if (std::any_of(units_left.begin(), units_left.end(), [](size_t n) { return n > 0; }))
    throw Error("internal error: an atomic tensor was not read whole");

  // 7. Checksums combined, central directories written, files renamed into place.
  const auto t = Clock::now();
  std::atomic<uint64_t> written{0};
  parallel::collectively(mpi, [&] {
    arena.execute([&] {
      tbb::parallel_for(size_t{0}, files.size(), [&](size_t f) { written += files[f]->finish(); });
    });
  });
  stats.finish_seconds = since(t);
  stats.bytes_written = written.load();
  return stats;
}

}  // namespace ucpkit::load
