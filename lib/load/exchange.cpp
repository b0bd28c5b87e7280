// Redundancy-bypassing load: owners read, one all-to-all per batch, out-of-order writes.
#include "load/exchange.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/crc32.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/torch/torch_file.h"
#include "tool/tool.h"
#include "ucp/mpi_session.h"

namespace ucpkit::load {

namespace {

// Runs `f` on every rank; if it threw on any rank, all ranks throw (the failing one its message),
// so that no rank is left waiting in the next collective.
template <class F>
void collective_step(ucp::MpiSession& mpi, F&& f) {
  std::string failure;
  try {
    f();
  } catch (const std::exception& e) {
    failure = e.what();
    if (failure.empty()) failure = "unknown error";
  }
  if (mpi.any(!failure.empty())) throw Error(failure.empty() ? "another MPI rank failed" : failure);
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One piece of a reserved record to fill: bytes [begin, end) of record `record` of file `file`.
struct Item {
  size_t file, record;
  uint64_t begin, end;
};

}  // namespace

nlohmann::json ExchangePlan::to_json(const ModelInfo& model) const {
  nlohmann::json j;
  j["ranks"] = ranks;
  j["batch_bytes"] = batch_bytes;
  std::vector<uint64_t> per_rank(static_cast<size_t>(ranks), 0);
  auto& bs = j["batches"] = nlohmann::json::array();
  for (const auto& b : batches) {
    nlohmann::json reads = nlohmann::json::array();
    uint64_t bytes = 0;
    for (size_t k : b) {
      const Read& r = this->reads[k];
      reads.push_back({{"param", model.params[r.param].name}, {"state", model.states[r.state]}, {"bytes", r.bytes},
                       {"owner", r.owner}});
      bytes += r.bytes;
      per_rank[static_cast<size_t>(r.owner)] += r.bytes;
    }
    bs.push_back({{"bytes", bytes}, {"reads", reads}});
  }
  j["bytes_read_per_rank"] = per_rank;
  return j;
}

ExchangePlan plan_exchange(const ModelInfo& model, int ranks, uint64_t batch_bytes) {
  if (ranks < 1) throw Error("plan_exchange: no ranks");
  ExchangePlan plan;
  plan.ranks = ranks;
  plan.batch_bytes = batch_bytes;
  std::vector<uint64_t> total(static_cast<size_t>(ranks), 0);
  std::vector<size_t> open;  // reads of the batch being formed
  uint64_t open_bytes = 0;
  auto close = [&] {
    if (open.empty()) return;
    // Largest first onto the rank with the fewest bytes in this batch (then overall, then lowest).
    std::vector<size_t> order = open;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return plan.reads[a].bytes > plan.reads[b].bytes; });
    std::vector<uint64_t> load(static_cast<size_t>(ranks), 0);
    for (size_t k : order) {
      int best = 0;
      for (int r = 1; r < ranks; ++r)
        if (std::pair(load[r], total[r]) < std::pair(load[best], total[best])) best = r;
      plan.reads[k].owner = best;
      load[best] += plan.reads[k].bytes;
      total[best] += plan.reads[k].bytes;
    }
    plan.batches.push_back(open);
    open.clear();
    open_bytes = 0;
  };
  for (size_t i = 0; i < model.params.size(); ++i) {
    const uint64_t bytes = static_cast<uint64_t>(model.params[i].stored_numel) * 4;
    for (size_t s = 0; s < model.states.size(); ++s) {
      ExchangePlan::Read r;
      r.param = static_cast<int>(i);
      r.state = static_cast<int>(s);
      r.bytes = bytes;
      r.batch = static_cast<int>(plan.batches.size());
      open.push_back(plan.reads.size());
      plan.reads.push_back(r);
      open_bytes += bytes;
      if (open_bytes >= batch_bytes) close();
    }
  }
  close();
  return plan;
}

void add_needs(const ModelInfo& model, const std::vector<DeepSpeedWriter::Source>& sources, DType dtype,
               AtomicNeeds& needs) {
  const uint64_t es = dtype_size(dtype);
  for (const auto& s : sources) {
    const int64_t n = static_cast<int64_t>((s.byte_end - s.byte_begin) / es);
    auto& v = needs[{s.slot->param, s.state}];
    for_each_run(model.params[s.slot->param].shape, s.slot->slice, s.param_offset, s.param_offset + n,
                 [&](int64_t src, int64_t count, int64_t) {
                   if (src >= 0) v.emplace_back(src, count);
                 });
  }
}

void normalize_needs(AtomicNeeds& needs) {
  for (auto& [key, v] : needs) {
    std::sort(v.begin(), v.end());
    std::vector<std::pair<int64_t, int64_t>> merged;
    for (const auto& [start, count] : v) {
      if (!merged.empty() && start <= merged.back().first + merged.back().second) {
        auto& m = merged.back();
        m.second = std::max(m.first + m.second, start + count) - m.first;
      } else {
        merged.emplace_back(start, count);
      }
    }
    v = std::move(merged);
  }
}

ExchangeStats run_exchange(std::vector<std::unique_ptr<DeferredTorchFile>>& files, const DeepSpeedWriter& writer,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           ucp::MpiSession& mpi, int threads) {
  ExchangeStats stats;
  const int me = mpi.rank(), nranks = mpi.size();
  if (plan.ranks != nranks) throw Error("exchange plan made for " + std::to_string(plan.ranks) + " ranks");
  tbb::task_arena arena(threads);

  // 1. What this rank writes: every reserved record cut into pieces by source parameter (gaps
  //    between sources are zeros, written first), and the atomic elements those pieces need.
  std::vector<int> batch_of(model.params.size() * model.states.size(), 0);  // [param * states + state]
  for (const auto& r : plan.reads) batch_of[static_cast<size_t>(r.param) * model.states.size() + r.state] = r.batch;
  std::vector<std::vector<Item>> items(plan.batches.size() + 1);  // [0]: gaps; [b + 1]: batch b
  AtomicNeeds mine;
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& records = files[f]->records();
    for (size_t k = 0; k < records.size(); ++k) {
      const Storage& st = *records[k].storage;
      auto sources = writer.sources_of(&st);
      std::sort(sources.begin(), sources.end(), [](const auto& a, const auto& b) { return a.byte_begin < b.byte_begin; });
      uint64_t at = 0;
      for (const auto& s : sources) {
        if (s.byte_begin > at) items[0].push_back({f, k, at, s.byte_begin});
        const size_t key = static_cast<size_t>(s.slot->param) * model.states.size() + static_cast<size_t>(s.state);
        items[static_cast<size_t>(batch_of[key]) + 1].push_back({f, k, s.byte_begin, s.byte_end});
        at = std::max(at, s.byte_end);
      }
      if (at < st.nbytes()) items[0].push_back({f, k, at, st.nbytes()});
      add_needs(model, sources, st.dtype(), mine);
    }
  }
  normalize_needs(mine);

  // 2. Everyone's needs, so that owners know what to send where (once, before the batches).
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
  auto needed = [&](int rank, const ExchangePlan::Read& rd) -> const std::vector<std::pair<int64_t, int64_t>>* {
    const auto& m = needs[static_cast<size_t>(rank)];
    auto it = m.find({rd.param, rd.state});
    return it == m.end() ? nullptr : &it->second;
  };
  auto count_of = [](const std::vector<std::pair<int64_t, int64_t>>* v) {
    uint64_t n = 0;
    if (v)
      for (const auto& iv : *v) n += static_cast<uint64_t>(iv.second);
    return n;
  };

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
    collective_step(mpi, [&] { fill(items[0]); });
    stats.fill_seconds += since(t);
  }

  tool::Progress progress("ucp-load", plan.batches.size());
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    const auto& batch = plan.batches[b];
    // 3. Owners read their tensors of the batch whole (checksum in the same pass).
    std::vector<size_t> owned;
    for (size_t k : batch)
      if (plan.reads[k].owner == me) owned.push_back(k);
    std::vector<std::vector<float>> data(owned.size());
    auto t = Clock::now();
    collective_step(mpi, [&] {
      check_interrupted();  // SIGINT/SIGTERM: every rank stops at the start of the next batch
      // Every tensor in parts of 8 MiB, all at once (a batch is often one large tensor); the
      // parts' CRCs are combined in order and checked against the manifest.
      constexpr int64_t kPart = 2 << 20;  // elements
      std::vector<std::pair<size_t, int64_t>> parts;  // (owned index, first element)
      for (size_t i = 0; i < owned.size(); ++i) {
        const int64_t n = static_cast<int64_t>(plan.reads[owned[i]].bytes / 4);
        data[i].resize(static_cast<size_t>(n));
        for (int64_t a = 0; a < n || a == 0; a += kPart) parts.emplace_back(i, a);
      }
      std::vector<uint32_t> crcs(parts.size(), 0);
      arena.execute([&] {
        tbb::parallel_for(size_t{0}, parts.size(), [&](size_t p) {
          const auto [i, a] = parts[p];
          const auto& rd = plan.reads[owned[i]];
          const int64_t n = std::min<int64_t>(kPart, static_cast<int64_t>(data[i].size()) - a);
          crcs[p] = reader.read_part(rd.param, model.states[static_cast<size_t>(rd.state)], a, n, data[i].data() + a);
        });
      });
      for (size_t p = 0; p < parts.size();) {
        const size_t i = parts[p].first;
        uint32_t crc = 0;
        for (; p < parts.size() && parts[p].first == i; ++p) {
          const int64_t n = std::min<int64_t>(kPart, static_cast<int64_t>(data[i].size()) - parts[p].second);
          crc = parts[p].second == 0 ? crcs[p] : crc32_combine(crc, crcs[p], static_cast<uint64_t>(n) * 4);
        }
        const auto& rd = plan.reads[owned[i]];
        reader.verify_whole(rd.param, model.states[static_cast<size_t>(rd.state)], crc);
      }
    });
    stats.read_seconds += since(t);
    // 4. One all-to-all: for every other rank, the intervals it needs of every tensor read here, in
    //    batch order (this rank's own needs are served from its read buffers, not copied).
    t = Clock::now();
    std::vector<uint64_t> send_counts(static_cast<size_t>(nranks), 0), recv_counts(static_cast<size_t>(nranks), 0);
    for (int r = 0; r < nranks; ++r)
      if (r != me)
        for (size_t i = 0; i < owned.size(); ++i) send_counts[r] += count_of(needed(r, plan.reads[owned[i]]));
    for (size_t k : batch)
      if (plan.reads[k].owner != me) recv_counts[plan.reads[k].owner] += count_of(needed(me, plan.reads[k]));
    std::vector<uint64_t> send_at(static_cast<size_t>(nranks) + 1, 0);
    std::partial_sum(send_counts.begin(), send_counts.end(), send_at.begin() + 1);
    std::vector<float> send(send_at.back());
    arena.execute([&] {
      tbb::parallel_for(0, nranks, [&](int r) {
        if (r == me) return;
        float* out = send.data() + send_at[r];
        for (size_t i = 0; i < owned.size(); ++i)
          if (const auto* v = needed(r, plan.reads[owned[i]]))
            for (const auto& [start, count] : *v) {
              std::memcpy(out, data[i].data() + start, static_cast<size_t>(count) * 4);
              out += count;
            }
      });
    });
    stats.pack_seconds += since(t);
    t = Clock::now();
    std::vector<float> recv = mpi.alltoallv(send, send_counts, recv_counts);
    std::vector<float>().swap(send);
    stats.alltoall_seconds += since(t);
    // 5. The received intervals (and this rank's own reads) become the cache; this rank's pieces of
    //    the batch are written.
    cache.clear();
    std::vector<uint64_t> recv_at(static_cast<size_t>(nranks) + 1, 0);
    std::partial_sum(recv_counts.begin(), recv_counts.end(), recv_at.begin() + 1);
    size_t own = 0;
    for (size_t k : batch) {
      const auto& rd = plan.reads[k];
      const float* mine_data = rd.owner == me ? data[own++].data() : nullptr;
      if (const auto* v = needed(me, rd))
        for (const auto& [start, count] : *v) {
          if (mine_data) {
            cache.add(rd.param, rd.state, start, count, mine_data + start);
          } else {
            cache.add(rd.param, rd.state, start, count, recv.data() + recv_at[rd.owner]);
            recv_at[rd.owner] += static_cast<uint64_t>(count);
          }
        }
    }
    t = Clock::now();
    collective_step(mpi, [&] { fill(items[b + 1]); });
    stats.fill_seconds += since(t);
    cache.clear();
    if (me == 0) progress.advance();
  }
  progress.finish();

  // 6. Checksums combined, central directories written, files renamed into place.
  const auto t = Clock::now();
  std::atomic<uint64_t> written{0};
  collective_step(mpi, [&] {
    arena.execute([&] {
      tbb::parallel_for(size_t{0}, files.size(), [&](size_t f) { written += files[f]->finish(); });
    });
  });
  stats.finish_seconds = since(t);
  stats.bytes_written = written.load();
  return stats;
}

}  // namespace ucpkit::load
