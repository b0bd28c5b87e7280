// The exchange's plan: needs, units, file writers, unit owners, batches (no I/O, no MPI).
#include "load/exchange_plan.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <numeric>

#include <tbb/parallel_for.h>

#include "core/error.h"
#include "core/staging.h"
#include "io/torch/torch_file.h"
#include "load/universal_reader.h"
#include "parallel/share.h"
#include "parallel/threads.h"

namespace ucpkit::load {

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

std::vector<FileNeeds> file_needs(const std::vector<LaidOutFile>& files, const DeepSpeedWriter& writer,
                                  const ModelInfo& model, int threads) {
  std::vector<FileNeeds> out(files.size());
  parallel::in_arena(threads, [&] {
    tbb::parallel_for(size_t{0}, files.size(), [&](size_t f) {
      check_interrupted();
      for (const auto& st : generated_storages(files[f].root)) {
        const auto sources = writer.sources_of(st.get());
        for (const auto& s : sources) out[f].bytes += s.byte_end - s.byte_begin;
        add_needs(model, sources, st->dtype(), out[f].elements);
      }
      normalize_needs(out[f].elements);
    });
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

}  // namespace ucpkit::load
