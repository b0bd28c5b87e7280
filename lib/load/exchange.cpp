// Redundancy-bypassing load: owners read, one all-to-all per batch, out-of-order writes.
#include "load/exchange.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "core/error.h"
#include "io/torch/torch_file.h"
#include "tool/tool.h"
#include "ucp/mpi_session.h"

namespace ucpkit::load {

namespace {

uint64_t numel_of(const ParamInfo& p) {
  uint64_t n = 1;
  for (auto d : p.shape) n *= static_cast<uint64_t>(d);
  return n;
}

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
    const uint64_t bytes = numel_of(model.params[i]) * 4;
    for (size_t s = 0; s < model.states.size(); ++s) {
      ExchangePlan::Read r;
      r.param = static_cast<int>(i);
      r.state = static_cast<int>(s);
      r.bytes = bytes;
      r.batch = static_cast<int>(plan.batches.size());
      open.push_back(plan.reads.size());
      plan.reads.push_back(r);
      open_bytes += bytes;
    }
    if (open_bytes >= batch_bytes) close();
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

uint64_t run_exchange(std::vector<std::unique_ptr<DeferredTorchFile>>& files, const DeepSpeedWriter& writer,
                      UniversalReader& reader, const ModelInfo& model, const ExchangePlan& plan, ucp::MpiSession& mpi,
                      int threads) {
  const int me = mpi.rank(), nranks = mpi.size();
  if (plan.ranks != nranks) throw Error("exchange plan made for " + std::to_string(plan.ranks) + " ranks");
  tbb::task_arena arena(threads);

  // 1. What this rank writes: every reserved record cut into pieces by source parameter (gaps
  //    between sources are zeros, written first), and the atomic elements those pieces need.
  std::vector<int> batch_of_param(model.params.size(), 0);
  for (const auto& r : plan.reads) batch_of_param[static_cast<size_t>(r.param)] = r.batch;
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
        items[static_cast<size_t>(batch_of_param[s.slot->param]) + 1].push_back({f, k, s.byte_begin, s.byte_end});
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

  // Fills the pieces in `list` (window by window, several threads), reading through the cache.
  constexpr uint64_t kWindow = 8u << 20;
  auto fill = [&](const std::vector<Item>& list) {
    std::vector<Item> chunks;
    for (const Item& it : list) {
      const uint64_t es = dtype_size(files[it.file]->records()[it.record].storage->dtype());
      const uint64_t step = std::max<uint64_t>(es, kWindow / es * es);
      for (uint64_t a = it.begin; a < it.end; a += step) chunks.push_back({it.file, it.record, a, std::min(it.end, a + step)});
    }
    arena.execute([&] {
      tbb::parallel_for(size_t{0}, chunks.size(), [&](size_t c) {
        const Item& it = chunks[c];
        thread_local std::vector<uint8_t> window;
        const size_t n = static_cast<size_t>(it.end - it.begin);
        if (window.size() < n) window.resize(n);
        std::span<uint8_t> w(window.data(), n);
        files[it.file]->records()[it.record].storage->generate(it.begin, w);
        files[it.file]->write(it.record, it.begin, w);
      });
    });
  };

  AtomicCache cache;
  reader.set_cache(&cache);  // from here on read_range never touches the files
  struct Reset {
    UniversalReader& r;
    ~Reset() { r.set_cache(nullptr); }
  } reset{reader};
  collective_step(mpi, [&] { fill(items[0]); });

  tool::Progress progress("ucp-load", plan.batches.size());
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    const auto& batch = plan.batches[b];
    // 3. Owners read their tensors of the batch whole (checksum in the same pass).
    std::vector<size_t> owned;
    for (size_t k : batch)
      if (plan.reads[k].owner == me) owned.push_back(k);
    std::vector<std::vector<float>> data(owned.size());
    collective_step(mpi, [&] {
      arena.execute([&] {
        tbb::parallel_for(size_t{0}, owned.size(), [&](size_t i) {
          const auto& rd = plan.reads[owned[i]];
          data[i].resize(static_cast<size_t>(rd.bytes / 4));
          reader.read_whole(rd.param, model.states[static_cast<size_t>(rd.state)], data[i].data());
        });
      });
    });
    // 4. One all-to-all: for every rank, the intervals it needs of every tensor read here, in batch order.
    std::vector<uint64_t> send_counts(static_cast<size_t>(nranks), 0), recv_counts(static_cast<size_t>(nranks), 0);
    for (int r = 0; r < nranks; ++r)
      for (size_t i = 0; i < owned.size(); ++i) send_counts[r] += count_of(needed(r, plan.reads[owned[i]]));
    for (size_t k : batch) recv_counts[plan.reads[k].owner] += count_of(needed(me, plan.reads[k]));
    std::vector<uint64_t> send_at(static_cast<size_t>(nranks) + 1, 0);
    std::partial_sum(send_counts.begin(), send_counts.end(), send_at.begin() + 1);
    std::vector<float> send(send_at.back());
    arena.execute([&] {
      tbb::parallel_for(0, nranks, [&](int r) {
        float* out = send.data() + send_at[r];
        for (size_t i = 0; i < owned.size(); ++i)
          if (const auto* v = needed(r, plan.reads[owned[i]]))
            for (const auto& [start, count] : *v) {
              std::memcpy(out, data[i].data() + start, static_cast<size_t>(count) * 4);
              out += count;
            }
      });
    });
    data.clear();
    std::vector<float> recv = mpi.alltoallv(send, send_counts, recv_counts);
    std::vector<float>().swap(send);
    // 5. The received intervals become the cache; this rank's pieces of the batch are written.
    cache.clear();
    std::vector<uint64_t> recv_at(static_cast<size_t>(nranks) + 1, 0);
    std::partial_sum(recv_counts.begin(), recv_counts.end(), recv_at.begin() + 1);
    for (size_t k : batch) {
      const auto& rd = plan.reads[k];
      if (const auto* v = needed(me, rd))
        for (const auto& [start, count] : *v) {
          cache.add(rd.param, rd.state, start, count, recv.data() + recv_at[rd.owner]);
          recv_at[rd.owner] += static_cast<uint64_t>(count);
        }
    }
    collective_step(mpi, [&] { fill(items[b + 1]); });
    cache.clear();
    if (me == 0) progress.advance();
  }
  progress.finish();

  // 6. Checksums combined, central directories written, files renamed into place.
  std::atomic<uint64_t> written{0};
  collective_step(mpi, [&] {
    arena.execute([&] {
      tbb::parallel_for(size_t{0}, files.size(), [&](size_t f) { written += files[f]->finish(); });
    });
  });
  return written.load();
}

}  // namespace ucpkit::load
