// The exchange's plan: needs, units, file writers, unit owners, batches; and one rank's part of it
// (fill pieces, send and receive counts per batch). No I/O, no MPI.
#include "reshard/exchange_plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>

#include <tbb/parallel_for.h>

#include "core/error.h"
#include "core/staging.h"
#include "io/torch/torch_file.h"
#include "reshard/universal_reader.h"
#include "parallel/share.h"
#include "parallel/threads.h"

namespace ucpkit::reshard {

nlohmann::json ExchangePlan::to_json(const ModelInfo& model) const {
  nlohmann::json j;
  j["ranks"] = ranks;
  j["batch_bytes"] = batch_bytes;
  j["unit_elements"] = unit_elements;
  std::vector<uint64_t> per_rank(static_cast<size_t>(ranks), 0);
  auto& bs = j["batches"] = nlohmann::json::array();
  for (const auto& b : batches) {
    nlohmann::json reads = nlohmann::json::array();
    uint64_t bytes = 0;
    for (size_t k : b) {
      const Read& r = this->reads[k];
      reads.push_back({{"param", model.params[r.param].name}, {"state", model.states[r.state]}, {"start", r.start},
                       {"count", r.count}, {"bytes", r.bytes}, {"owner", r.owner}});
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
  plan.unit_elements = std::max<int64_t>(1, static_cast<int64_t>(batch_bytes / 32 / 4));
  cut_units(model, plan);
  plan.file_ranks = assign_files(files, ranks);
  const UnitNeeds needs = unit_needs(model, files, plan);
  choose_owners(needs, plan);
  cut_batches(merge_queues(needs.queue, plan), plan);
  return plan;
}

void cut_units(const ModelInfo& model, ExchangePlan& plan) {
  const size_t nstates = model.states.size(), ntensors = model.params.size() * nstates;
  plan.reads.clear();
  plan.first_unit.clear();
  for (size_t t = 0; t < ntensors; ++t) {
    plan.first_unit.push_back(plan.reads.size());
    const int64_t n = model.params[t / nstates].stored_numel;
    for (int64_t a = 0; a < n || a == 0; a += plan.unit_elements) {
      ExchangePlan::Read r;
      r.param = static_cast<int>(t / nstates);
      r.state = static_cast<int>(t % nstates);
      r.start = a;
      r.count = std::min(plan.unit_elements, n - a);
      r.bytes = static_cast<uint64_t>(r.count) * 4;
      plan.reads.push_back(r);
    }
  }
  plan.first_unit.push_back(plan.reads.size());
}

std::vector<int> assign_files(const std::vector<FileNeeds>& files, int ranks) {
  std::vector<uint64_t> file_bytes;
  for (const auto& f : files) file_bytes.push_back(f.bytes);
  std::vector<int> file_ranks = parallel::assign_by_size(file_bytes, ranks);
  std::vector<size_t> count(static_cast<size_t>(ranks), 0);
  for (size_t f = 0; f < files.size(); ++f)
    if (files[f].bytes > 0) ++count[static_cast<size_t>(file_ranks[f])];
  for (size_t f = 0; f < files.size(); ++f)
    if (files[f].bytes == 0) {
      const auto r = static_cast<size_t>(std::min_element(count.begin(), count.end()) - count.begin());
      file_ranks[f] = static_cast<int>(r);
      ++count[r];
    }
  return file_ranks;
}

namespace {

// How many elements of each unit `elements` covers (units in plan.reads order).
std::map<size_t, uint64_t> elements_per_unit(const ModelInfo& model, const AtomicNeeds& elements,
                                             const ExchangePlan& plan) {
  const size_t ntensors = plan.first_unit.size() - 1;
  std::map<size_t, uint64_t> per_unit;
  for (const auto& [key, v] : elements) {
    const size_t t = tensor_index(model, key.first, key.second);
    if (t >= ntensors) throw Error("plan_exchange: tensor index out of range");
    for (const auto& [start, count] : v)
      for (int64_t a = start; a < start + count;) {
        const size_t u = plan.first_unit[t] + static_cast<size_t>(a / plan.unit_elements);
        const int64_t end = std::min(start + count, (a / plan.unit_elements + 1) * plan.unit_elements);
        per_unit[u] += static_cast<uint64_t>(end - a);
        a = end;
      }
  }
  return per_unit;
}

}  // namespace

UnitNeeds unit_needs(const ModelInfo& model, const std::vector<FileNeeds>& files, const ExchangePlan& plan) {
  const size_t nunits = plan.reads.size();
  UnitNeeds out;
  out.by_rank.resize(nunits);
  out.queue.assign(nunits, -1);
  std::vector<uint64_t> queue_need(nunits, 0);
  for (size_t f = 0; f < files.size(); ++f) {
    const int rank = plan.file_ranks[f];
    for (const auto& [u, n] : elements_per_unit(model, files[f].elements, plan)) {
      auto& v = out.by_rank[u];
      auto it = std::find_if(v.begin(), v.end(), [&](const auto& e) { return e.first == rank; });
      if (it == v.end()) v.emplace_back(rank, n); else it->second += n;
      if (n > queue_need[u]) queue_need[u] = n, out.queue[u] = static_cast<long>(f);
    }
  }
  return out;
}

void choose_owners(const UnitNeeds& needs, ExchangePlan& plan) {
  // Among the ranks that need at least 9/10 as much of the unit as the rank that needs most (ZeRO-3
  // splits every parameter evenly over the DP ranks, equal up to rounding), the one that has read
  // least, then the lowest.
  std::vector<uint64_t> read(static_cast<size_t>(plan.ranks), 0);
  for (size_t u = 0; u < plan.reads.size(); ++u) {
    int best = -1;
    uint64_t most = 0;
    for (const auto& [r, n] : needs.by_rank[u]) most = std::max(most, n);
    auto better = [&](int r, int than) {
      return than < 0 || read[r] < read[than] || (read[r] == read[than] && r < than);
    };
    if (most == 0) {
      for (int r = 0; r < plan.ranks; ++r)
        if (better(r, best)) best = r;
    } else {
      for (const auto& [r, n] : needs.by_rank[u])
        if (n * 10 >= most * 9 && better(r, best)) best = r;
    }
    plan.reads[u].owner = best;
    read[static_cast<size_t>(best)] += plan.reads[u].bytes;
  }
}

std::vector<size_t> merge_queues(const std::vector<long>& queue, const ExchangePlan& plan) {
  const size_t nunits = plan.reads.size();
  // Unit u lies at the fraction key[u] of its queue's bytes.
  std::map<long, uint64_t> queue_total, done;
  for (size_t u = 0; u < nunits; ++u) queue_total[queue[u]] += plan.reads[u].bytes;
  std::vector<double> key(nunits, 0);
  for (size_t u = 0; u < nunits; ++u) {
    const uint64_t total = std::max<uint64_t>(queue_total[queue[u]], 1);
    uint64_t& d = done[queue[u]];
    key[u] = (static_cast<double>(d) + static_cast<double>(plan.reads[u].bytes) / 2) / static_cast<double>(total);
    d += plan.reads[u].bytes;
  }
  std::vector<size_t> order(nunits);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  return order;
}

void cut_batches(const std::vector<size_t>& order, ExchangePlan& plan) {
  plan.batches.clear();
  std::vector<size_t> open;
  uint64_t open_bytes = 0;
  auto close = [&] {
    if (open.empty()) return;
    std::sort(open.begin(), open.end());  // model order inside a batch
    for (size_t u : open) plan.reads[u].batch = static_cast<int>(plan.batches.size());
    plan.batches.push_back(std::move(open));
    open.clear();
    open_bytes = 0;
  };
  for (size_t u : order) {
    open.push_back(u);
    open_bytes += plan.reads[u].bytes;
    if (open_bytes >= plan.batch_bytes) close();
  }
  close();
}

uint64_t needed_count(const AtomicNeeds& needs, const ExchangePlan::Read& unit) {
  uint64_t n = 0;
  for_each_needed(needs, unit, [&](int64_t, int64_t count) { n += static_cast<uint64_t>(count); });
  return n;
}

std::vector<FillPiece> fill_pieces(const std::vector<StorageSource>& sources, uint64_t element_size,
                                   uint64_t nbytes, const ModelInfo& model, const ExchangePlan& plan) {
  std::vector<FillPiece> out;
  auto piece = [&](size_t step, uint64_t begin, uint64_t end) { out.push_back({step, begin, end}); };
  const uint64_t es = element_size;
  uint64_t at = 0;
  for (const auto& s : sources) {
    if (s.byte_begin > at) piece(size_t{0}, at, s.byte_begin);
    const size_t t = tensor_index(model, s.slot->param, s.state);
    const int64_t n = static_cast<int64_t>((s.byte_end - s.byte_begin) / es);
    size_t step = 0;
    uint64_t begin = s.byte_begin;
    bool started = false;
    for_each_run(model.params[s.slot->param].shape, s.slot->slice, s.param_offset, s.param_offset + n,
                 [&](int64_t src, int64_t count, int64_t out_at) {
                   if (src < 0) {
                     started = true;
                     return;
                   }
                   for (int64_t done = 0; done < count;) {
                     const int64_t e = src + done, k = e / plan.unit_elements;
                     const size_t u = plan.first_unit[t] + static_cast<size_t>(k);
                     const size_t here = static_cast<size_t>(plan.reads[u].batch) + 1;
                     const uint64_t pos = s.byte_begin + static_cast<uint64_t>(out_at + done) * es;
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
  if (at < nbytes) piece(size_t{0}, at, nbytes);
  return out;
}

std::pair<uint64_t, uint64_t> fill_costs(const std::vector<std::vector<int64_t>>& step_bytes) {
  uint64_t cost = 0, even = 0;
  const size_t steps = step_bytes.empty() ? 0 : step_bytes[0].size();
  const auto nranks = static_cast<uint64_t>(step_bytes.size());
  for (size_t s = 0; s < steps; ++s) {
    uint64_t top = 0, sum = 0;
    for (const auto& r : step_bytes) {
      top = std::max(top, static_cast<uint64_t>(r.at(s)));
      sum += static_cast<uint64_t>(r.at(s));
    }
    cost += top;
    even += (sum + nranks - 1) / nranks;
  }
  return {cost, even};
}

std::vector<int64_t> flatten_needs(const AtomicNeeds& needs) {
  std::vector<int64_t> flat;
  for (const auto& [key, v] : needs)
    for (const auto& [start, count] : v) flat.insert(flat.end(), {key.first, key.second, start, count});
  return flat;
}

AtomicNeeds unflatten_needs(const std::vector<int64_t>& flat) {
  AtomicNeeds needs;
  for (size_t i = 0; i + 3 < flat.size(); i += 4)
    needs[{static_cast<int>(flat[i]), static_cast<int>(flat[i + 1])}].emplace_back(flat[i + 2], flat[i + 3]);
  return needs;
}

RankBatches plan_rank_batches(const ExchangePlan& plan, const std::vector<AtomicNeeds>& needs, int rank) {
  const int nranks = static_cast<int>(needs.size());
  RankBatches out;
  out.batches.resize(plan.batches.size());
  for (size_t b = 0; b < plan.batches.size(); ++b) {
    auto& x = out.batches[b];
    x.send_counts.assign(static_cast<size_t>(nranks), 0);
    x.recv_counts.assign(static_cast<size_t>(nranks), 0);
    x.owned_at.push_back(0);
    for (size_t k : plan.batches[b]) {
      const auto& rd = plan.reads[k];
      if (rd.owner == rank) {
        x.owned.push_back(k);
        x.owned_at.push_back(x.owned_at.back() + rd.bytes / 4);
        for (int r = 0; r < nranks; ++r)
          if (r != rank) x.send_counts[static_cast<size_t>(r)] += needed_count(needs[static_cast<size_t>(r)], rd);
      } else {
        x.recv_counts[static_cast<size_t>(rd.owner)] += needed_count(needs[static_cast<size_t>(rank)], rd);
      }
    }
    out.max_owned = std::max(out.max_owned, x.owned_at.back());
    out.max_send = std::max(out.max_send, std::accumulate(x.send_counts.begin(), x.send_counts.end(), uint64_t{0}));
    out.max_recv = std::max(out.max_recv, std::accumulate(x.recv_counts.begin(), x.recv_counts.end(), uint64_t{0}));
  }
  return out;
}

std::vector<FileNeeds> file_needs(const std::vector<LaidOutFile>& files, const ModelInfo& model, int threads) {
  std::vector<FileNeeds> out(files.size());
  parallel::in_arena(threads, [&] {
    tbb::parallel_for(size_t{0}, files.size(), [&](size_t f) {
      check_interrupted();
      for (const auto& st : generated_storages(files[f].root)) {
        const auto& sources = files[f].sources_of(st.get());
        for (const auto& s : sources) out[f].bytes += s.byte_end - s.byte_begin;
        add_needs(model, sources, st->dtype(), out[f].elements);
      }
      normalize_needs(out[f].elements);
    });
  });
  return out;
}

void add_needs(const ModelInfo& model, const std::vector<StorageSource>& sources, DType dtype,
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

}  // namespace ucpkit::reshard
