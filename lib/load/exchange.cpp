// Redundancy-bypassing load: owners read, one all-to-all per batch, out-of-order writes.
#include "load/exchange.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <numeric>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/crc32.h"
#include "core/error.h"
#include "core/staging.h"
#include "io/torch/torch_file.h"
#include "tool/tool.h"
#include "ucp/mpi_session.h"
#include "ucp/plan.h"

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

ExchangePlan plan_exchange(const ModelInfo& model, const std::vector<FileNeeds>& files, int ranks,
                           uint64_t batch_bytes) {
  if (ranks < 1) throw Error("plan_exchange: no ranks");
  ExchangePlan plan;
  plan.ranks = ranks;
  plan.batch_bytes = batch_bytes;
  const size_t nstates = model.states.size(), ntensors = model.params.size() * nstates;

  // Files onto ranks, balanced by bytes.
  std::vector<uint64_t> file_bytes;
  for (const auto& f : files) {
    uint64_t n = 0;
    for (const auto& [t, bytes] : f) n += bytes;
    file_bytes.push_back(n);
  }
  plan.file_ranks = ucp::assign_by_size(file_bytes, ranks);

  // Per tensor: the bytes each rank's files need, and the file that needs most (its queue).
  std::vector<std::vector<uint64_t>> need(ntensors, std::vector<uint64_t>(static_cast<size_t>(ranks), 0));
  std::vector<std::map<size_t, uint64_t>> per_file(ntensors);
  for (size_t f = 0; f < files.size(); ++f)
    for (const auto& [t, bytes] : files[f]) {
      if (t >= ntensors) throw Error("plan_exchange: tensor index out of range");
      need[t][static_cast<size_t>(plan.file_ranks[f])] += bytes;
      per_file[t][f] += bytes;
    }
  std::vector<long> queue_of(ntensors, -1);  // -1: needed by no file (a queue of its own)
  for (size_t t = 0; t < ntensors; ++t) {
    uint64_t best = 0;
    for (const auto& [f, bytes] : per_file[t])
      if (bytes > best) best = bytes, queue_of[t] = static_cast<long>(f);
  }

  // Owners in model order: the rank that needs most of the tensor, then the one that read least.
  std::vector<uint64_t> read(static_cast<size_t>(ranks), 0);
  plan.reads.resize(ntensors);
  for (size_t t = 0; t < ntensors; ++t) {
    auto& r = plan.reads[t];
    r.param = static_cast<int>(t / nstates);
    r.state = static_cast<int>(t % nstates);
    r.bytes = static_cast<uint64_t>(model.params[static_cast<size_t>(r.param)].stored_numel) * 4;
    int best = 0;
    for (int k = 1; k < ranks; ++k)
      if (std::pair(need[t][k], -static_cast<int64_t>(read[k])) >
          std::pair(need[t][best], -static_cast<int64_t>(read[best])))
        best = k;
    r.owner = best;
    read[static_cast<size_t>(best)] += r.bytes;
  }

  // The queues merged by progress: tensor t lies at the fraction key[t] of its queue's bytes.
  std::map<long, uint64_t> queue_total;
  for (size_t t = 0; t < ntensors; ++t) queue_total[queue_of[t]] += plan.reads[t].bytes;
  std::map<long, uint64_t> done;
  std::vector<double> key(ntensors, 0);
  for (size_t t = 0; t < ntensors; ++t) {
    const uint64_t total = std::max<uint64_t>(queue_total[queue_of[t]], 1);
    uint64_t& d = done[queue_of[t]];
    key[t] = (static_cast<double>(d) + static_cast<double>(plan.reads[t].bytes) / 2) / static_cast<double>(total);
    d += plan.reads[t].bytes;
  }
  std::vector<size_t> order(ntensors);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });

  std::vector<size_t> open;
  uint64_t open_bytes = 0;
  auto close = [&] {
    if (open.empty()) return;
    std::sort(open.begin(), open.end());  // model order inside a batch
    for (size_t t : open) plan.reads[t].batch = static_cast<int>(plan.batches.size());
    plan.batches.push_back(std::move(open));
    open.clear();
    open_bytes = 0;
  };
  for (size_t t : order) {
    open.push_back(t);
    open_bytes += plan.reads[t].bytes;
    if (open_bytes >= batch_bytes) close();
  }
  close();
  return plan;
}

std::vector<FileNeeds> file_needs(const std::vector<LaidOutFile>& files, const DeepSpeedWriter& writer,
                                  const ModelInfo& model) {
  std::vector<FileNeeds> out(files.size());
  tbb::parallel_for(size_t{0}, files.size(), [&](size_t f) {
    std::map<size_t, uint64_t> bytes;
    for (const auto& st : generated_storages(files[f].root))
      for (const auto& s : writer.sources_of(st.get()))
        bytes[static_cast<size_t>(s.slot->param) * model.states.size() + static_cast<size_t>(s.state)] +=
            s.byte_end - s.byte_begin;
    out[f].assign(bytes.begin(), bytes.end());
  });
  return out;
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

namespace {

// The pieces of a generated storage: its sources' byte ranges, each tagged with the fill step of
// its atomic tensor's batch (b + 1), and the gaps between them (zeros, step 0).
template <class F>
void for_each_piece(const Storage& st, const DeepSpeedWriter& writer, const ModelInfo& model,
                    const std::vector<int>& batch_of, F&& piece) {
  auto sources = writer.sources_of(&st);
  std::sort(sources.begin(), sources.end(), [](const auto& a, const auto& b) { return a.byte_begin < b.byte_begin; });
  uint64_t at = 0;
  for (const auto& s : sources) {
    if (s.byte_begin > at) piece(size_t{0}, at, s.byte_begin);
    const size_t key = static_cast<size_t>(s.slot->param) * model.states.size() + static_cast<size_t>(s.state);
    piece(static_cast<size_t>(batch_of[key]) + 1, s.byte_begin, s.byte_end);
    at = std::max(at, s.byte_end);
  }
  if (at < st.nbytes()) piece(size_t{0}, at, st.nbytes());
}

// A float buffer left uninitialized (it is always written before it is read).
std::unique_ptr<float[]> floats(uint64_t n) { return std::make_unique_for_overwrite<float[]>(std::max<uint64_t>(n, 1)); }

}  // namespace

ExchangeStats run_exchange(const std::vector<LaidOutFile>& laid_out, const DeepSpeedWriter& writer,
                           UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan,
                           ucp::MpiSession& mpi, int threads) {
  ExchangeStats stats;
  const int me = mpi.rank(), nranks = mpi.size();
  if (plan.ranks != nranks) throw Error("exchange plan made for " + std::to_string(plan.ranks) + " ranks");
  tbb::task_arena arena(threads);
  std::vector<int> batch_of(model.params.size() * model.states.size(), 0);  // [param * states + state]
  for (const auto& r : plan.reads) batch_of[static_cast<size_t>(r.param) * model.states.size() + r.state] = r.batch;
  const size_t steps = plan.batches.size() + 1;  // fill steps: [0] zeros; [b + 1] batch b

  // 1. This rank's files (the plan says who writes which).
  if (plan.file_ranks.size() != laid_out.size()) throw Error("exchange plan made for other files");
  std::vector<size_t> mine_of;
  for (size_t f = 0; f < laid_out.size(); ++f)
    if (plan.file_ranks[f] == me) mine_of.push_back(f);
  std::vector<std::unique_ptr<DeferredTorchFile>> files(mine_of.size());
  collective_step(mpi, [&] {
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
  for (size_t f = 0; f < files.size(); ++f) {
    const auto& records = files[f]->records();
    for (size_t k = 0; k < records.size(); ++k) {
      const Storage& st = *records[k].storage;
      for_each_piece(st, writer, model, batch_of,
                     [&](size_t step, uint64_t a, uint64_t b) { items[step].push_back({f, k, a, b}); });
      add_needs(model, writer.sources_of(&st), st.dtype(), mine);
    }
  }
  normalize_needs(mine);
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

  // Per batch: the tensors this rank owns, what it sends to and receives from each rank. The three
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
          if (r != me) x.send_counts[static_cast<size_t>(r)] += count_of(needed(r, rd));
      } else {
        x.recv_counts[static_cast<size_t>(rd.owner)] += count_of(needed(me, rd));
      }
    }
    max_owned = std::max(max_owned, x.owned_at.back());
    max_send = std::max(max_send, std::accumulate(x.send_counts.begin(), x.send_counts.end(), uint64_t{0}));
    max_recv = std::max(max_recv, std::accumulate(x.recv_counts.begin(), x.recv_counts.end(), uint64_t{0}));
  }
  const auto owned_buf = floats(max_owned), send_buf = floats(max_send), recv_buf = floats(max_recv);

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
    const auto& x = io[b];
    auto data = [&](size_t i) { return owned_buf.get() + x.owned_at[i]; };
    auto numel = [&](size_t i) { return static_cast<int64_t>(x.owned_at[i + 1] - x.owned_at[i]); };
    // 4. Owners read their tensors of the batch whole (checksum in the same pass).
    auto t = Clock::now();
    collective_step(mpi, [&] {
      check_interrupted();  // SIGINT/SIGTERM: every rank stops at the start of the next batch
      // Every tensor in parts of 8 MiB, all at once (a batch is often one large tensor); the
      // parts' CRCs are combined in order and checked against the manifest.
      constexpr int64_t kPart = 2 << 20;  // elements
      std::vector<std::pair<size_t, int64_t>> parts;  // (owned index, first element)
      for (size_t i = 0; i < x.owned.size(); ++i)
        for (int64_t a = 0; a < numel(i) || a == 0; a += kPart) parts.emplace_back(i, a);
      std::vector<uint32_t> crcs(parts.size(), 0);
      arena.execute([&] {
        tbb::parallel_for(size_t{0}, parts.size(), [&](size_t p) {
          const auto [i, a] = parts[p];
          const auto& rd = plan.reads[x.owned[i]];
          const int64_t n = std::min<int64_t>(kPart, numel(i) - a);
          crcs[p] = reader.read_part(rd.param, model.states[static_cast<size_t>(rd.state)], a, n, data(i) + a);
        });
      });
      for (size_t p = 0; p < parts.size();) {
        const size_t i = parts[p].first;
        uint32_t crc = 0;
        for (; p < parts.size() && parts[p].first == i; ++p) {
          const int64_t n = std::min<int64_t>(kPart, numel(i) - parts[p].second);
          crc = parts[p].second == 0 ? crcs[p] : crc32_combine(crc, crcs[p], static_cast<uint64_t>(n) * 4);
        }
        const auto& rd = plan.reads[x.owned[i]];
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
        for (size_t i = 0; i < x.owned.size(); ++i)
          if (const auto* v = needed(r, plan.reads[x.owned[i]]))
            for (const auto& [start, count] : *v) {
              std::memcpy(out, data(i) + start, static_cast<size_t>(count) * 4);
              out += count;
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
      if (const auto* v = needed(me, rd))
        for (const auto& [start, count] : *v) {
          if (mine_data) {
            cache.add(rd.param, rd.state, start, count, mine_data + start);
          } else {
            cache.add(rd.param, rd.state, start, count, recv_buf.get() + recv_at[rd.owner]);
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

  // 7. Checksums combined, central directories written, files renamed into place.
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
