// Node mapping and transfer schedule for re-placement.
#include "placement/migration.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"

namespace ucpkit::placement {
namespace {

// Distinct experts per node (or GPU) per layer as bitsets: [layer][unit * words + w].
struct Holdings {
  int units = 0, words = 0;
  std::vector<std::vector<uint64_t>> bits;
  bool has(int l, int u, int e) const { return (bits[l][u * words + (e >> 6)] >> (e & 63)) & 1; }
};

Holdings holdings(const Plan& plan, int unit_slots) {
  Holdings h;
  h.units = plan.cluster.slots() / unit_slots;
  h.words = (plan.experts + 63) / 64;
  for (const auto& layer : plan.layers) {
    std::vector<uint64_t> b(static_cast<size_t>(h.units) * h.words, 0);
    for (size_t p = 0; p < layer.phy2log.size(); ++p) {
      int u = static_cast<int>(p) / unit_slots, e = layer.phy2log[p];
      b[u * h.words + (e >> 6)] |= uint64_t{1} << (e & 63);
    }
    h.bits.push_back(std::move(b));
  }
  return h;
}

// The node index in `plan` of a physical node id (-1: not in the plan).
class NodeIndex {
 public:
  explicit NodeIndex(const Plan& plan) {
    for (size_t i = 0; i < plan.node_ids.size(); ++i) index_[plan.node_ids[i]] = static_cast<int>(i);
  }
  int operator()(int phys) const {
    auto it = index_.find(phys);
    return it == index_.end() ? -1 : it->second;
  }

 private:
  std::map<int, int> index_;
};

// The experts every node of `plan` holds, with expert ids up to `experts` (those of the next plan).
Holdings node_holdings(const Plan& plan, int experts) {
  Plan widened = plan;
  widened.experts = experts;
  return holdings(widened, plan.cluster.slots_per_node());
}

// Cloned for CPUs with a popcount instruction (the default build targets plain x86-64, where
// std::popcount is a library call: 270 M of them for the node matching at 1,024 nodes).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("popcnt", "default")))
#endif
long long
missing(const Holdings& want, int wu, const Holdings& have, int hu) {
  if (hu < 0) {
    long long n = 0;
    for (const auto& b : want.bits)
      for (int w = 0; w < want.words; ++w) n += std::popcount(b[wu * want.words + w]);
    return n;
  }
  long long n = 0;
  for (size_t l = 0; l < want.bits.size(); ++l)
    for (int w = 0; w < want.words; ++w)
      n += std::popcount(want.bits[l][wu * want.words + w] & ~have.bits[l][hu * have.words + w]);
  return n;
}

// Every layer's bits of each unit in one row ([unit][layer][word]): the node matching compares all
// pairs of nodes over every layer, which reads rows front to back instead of 64 scattered vectors.
std::vector<uint64_t> unit_rows(const Holdings& h) {
  const size_t row = h.bits.size() * static_cast<size_t>(h.words);
  std::vector<uint64_t> out(static_cast<size_t>(h.units) * row);
  for (size_t l = 0; l < h.bits.size(); ++l)
    for (int u = 0; u < h.units; ++u)
      std::copy_n(h.bits[l].begin() + static_cast<std::ptrdiff_t>(u) * h.words, h.words,
                  out.begin() + static_cast<std::ptrdiff_t>(u * row + l * h.words));
  return out;
}

// Bits of `want` not in `have` (have null: all of want's), over one row of `n` words each.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("popcnt", "default")))
#endif
long long
missing_row(const uint64_t* want, const uint64_t* have, size_t n) {
  long long c = 0;
  if (!have) {
    for (size_t k = 0; k < n; ++k) c += std::popcount(want[k]);
    return c;
  }
  for (size_t k = 0; k < n; ++k) c += std::popcount(want[k] & ~have[k]);
  return c;
}

}  // namespace

std::vector<int> min_cost_assignment(const std::vector<std::vector<long long>>& cost) {
  // Hungarian algorithm with potentials (Kuhn-Munkres, shortest augmenting paths), 1-based inside.
  const int n = static_cast<int>(cost.size());
  for (const auto& row : cost)
    if (static_cast<int>(row.size()) != n) throw Error("internal: assignment cost matrix is not square");
  const long long inf = std::numeric_limits<long long>::max() / 4;
  std::vector<long long> u(n + 1, 0), v(n + 1, 0);
  std::vector<int> p(n + 1, 0), way(n + 1, 0);  // p[j]: row matched to column j
  for (int i = 1; i <= n; ++i) {
    p[0] = i;
    int j0 = 0;
    std::vector<long long> minv(n + 1, inf);
    std::vector<char> used(n + 1, 0);
    do {
      used[j0] = 1;
      int i0 = p[j0], j1 = 0;
      long long delta = inf;
      for (int j = 1; j <= n; ++j) {
        if (used[j]) continue;
        long long cur = cost[i0 - 1][j - 1] - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (int j = 0; j <= n; ++j) {
        if (used[j]) {
          u[p[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (p[j0] != 0);
    do {
      int j1 = way[j0];
      p[j0] = p[j1];
      j0 = j1;
    } while (j0);
  }
  std::vector<int> col_of(n, -1);
  for (int j = 1; j <= n; ++j) col_of[p[j] - 1] = j - 1;
  return col_of;
}

std::vector<int> nodes_after_change(const Plan& current, const NodeChange& change) {
  std::set<int> failed;
  for (int f : change.failed) {
    if (std::find(current.node_ids.begin(), current.node_ids.end(), f) == current.node_ids.end()) {
      std::string ids;
      for (size_t i = 0; i < current.node_ids.size() && i < 16; ++i)
        ids += (i ? "," : "") + std::to_string(current.node_ids[i]);
      if (current.node_ids.size() > 16) ids += ",...";
      throw UsageError("failed node " + std::to_string(f) +
                       " is not in the current plan (--failed-nodes names its node_ids: " + ids + ")");
    }
    if (!failed.insert(f).second) throw UsageError("failed node " + std::to_string(f) + " listed twice");
  }
  if (change.added < 0) throw UsageError("--added-nodes must not be negative");
  // The size of the cluster after the change is checked before its node list is built, so an absurd
  // --added-nodes is refused at once instead of after gigabytes of ids.
  const long long left = static_cast<long long>(current.node_ids.size() - failed.size());
  const long long next = static_cast<long long>(*std::max_element(current.node_ids.begin(), current.node_ids.end())) +
                         1;
  Cluster after = current.cluster;
  const long long nodes = left + change.added;
  const long long slots = nodes * after.gpus_per_node * after.slots_per_gpu;
  if (nodes > std::numeric_limits<int>::max() || next + change.added > std::numeric_limits<int>::max() ||
      slots > std::numeric_limits<int>::max() / 4)
    throw UsageError("--added-nodes " + std::to_string(change.added) +
                     " makes the cluster too large: " + std::to_string(nodes) + " nodes x " +
                     std::to_string(after.gpus_per_node) + " GPUs x " + std::to_string(after.slots_per_gpu) + " slots");
  std::vector<int> ids;
  ids.reserve(static_cast<size_t>(nodes));
  for (int id : current.node_ids)
    if (!failed.count(id)) ids.push_back(id);
  for (int i = 0; i < change.added; ++i) ids.push_back(static_cast<int>(next + i));
  if (ids.empty()) throw UsageError("--failed-nodes lists every node of the current plan: no node left");
  return ids;
}

Migration migrate(const Plan& current, Plan& next, const std::vector<int>& physical_ids) {
  if (current.layers.size() != next.layers.size())
    throw Error("current plan has " + std::to_string(current.layers.size()) + " layers, loads have " +
                std::to_string(next.layers.size()));
  if (current.experts > next.experts)
    throw Error("current plan places " + std::to_string(current.experts) + " experts, loads have " +
                std::to_string(next.experts));
  const int N = next.cluster.nodes;
  const int node_slots = next.cluster.slots_per_node();
  const NodeIndex old_of(current);  // physical id -> node index in the current plan

  Plan widened = current;
  widened.experts = next.experts;
  Holdings have = holdings(widened, current.cluster.slots_per_node());
  Holdings want = holdings(next, node_slots);
  std::vector<std::vector<long long>> cost(N, std::vector<long long>(N));
  {
    const std::vector<uint64_t> want_rows = unit_rows(want), have_rows = unit_rows(have);
    const size_t row = want.bits.size() * static_cast<size_t>(want.words);  // have's rows are as long
    for (int i = 0; i < N; ++i) {
      const int old = old_of(physical_ids[i]);
      const uint64_t* h = old < 0 ? nullptr : have_rows.data() + static_cast<size_t>(old) * row;
      for (int q = 0; q < N; ++q) cost[i][q] = missing_row(want_rows.data() + static_cast<size_t>(q) * row, h, row);
    }
  }
  std::vector<int> logical_of = min_cost_assignment(cost);

  // The same optimal matching for the GPUs inside each node when GPU shapes agree.
  const bool match_gpus = current.cluster.gpus_per_node == next.cluster.gpus_per_node &&
                          current.cluster.slots_per_gpu == next.cluster.slots_per_gpu;
  Holdings have_gpu = match_gpus ? holdings(widened, current.cluster.slots_per_gpu) : Holdings{};
  Holdings want_gpu = holdings(next, next.cluster.slots_per_gpu);
  const int G = next.cluster.gpus_per_node, S = next.cluster.slots_per_gpu;
  std::vector<LayerPlacement> reordered(next.layers.size());
  for (auto& l : reordered) l.phy2log.assign(next.cluster.slots(), -1);
  for (int i = 0; i < N; ++i) {
    int q = logical_of[i], old = old_of(physical_ids[i]);
    std::vector<int> gpu_of(G);
    for (int g = 0; g < G; ++g) gpu_of[g] = g;
    if (match_gpus && old >= 0) {
      std::vector<std::vector<long long>> gc(G, std::vector<long long>(G));
      for (int g = 0; g < G; ++g)
        for (int h = 0; h < G; ++h) gc[g][h] = missing(want_gpu, q * G + h, have_gpu, old * G + g);
      gpu_of = min_cost_assignment(gc);
    }
    for (size_t l = 0; l < next.layers.size(); ++l)
      for (int g = 0; g < G; ++g)
        for (int s = 0; s < S; ++s)
          reordered[l].phy2log[(i * G + g) * S + s] = next.layers[l].phy2log[(q * G + gpu_of[g]) * S + s];
  }
  for (auto& l : reordered) l.phyrank = ranks_by_appearance(l.phy2log, next.experts);
  next.layers = std::move(reordered);
  next.node_ids = physical_ids;

  return list_fetches(current, next, physical_ids);
}

Migration list_fetches(const Plan& current, const Plan& next, const std::vector<int>& physical_ids) {
  const int N = next.cluster.nodes;
  const int node_slots = next.cluster.slots_per_node();
  const NodeIndex old_of(current);  // physical id -> node index in the current plan
  const Holdings have = node_holdings(current, next.experts);
  Migration m;
  m.node_ids = physical_ids;
  Holdings now = holdings(next, node_slots);
  // Per node of `next`: its index in the current plan (-1: added), looked up once; sends counted per
  // node of `next` (a surviving owner is one of them).
  std::vector<int> old(N);
  for (int i = 0; i < N; ++i) old[i] = old_of(physical_ids[i]);
  std::vector<long long> sends(N, 0);
  std::vector<int> owners;  // nodes of `next` that held e and survive
  for (size_t l = 0; l < next.layers.size(); ++l) {
    const int li = static_cast<int>(l);
    long long moved = 0;
    for (int e = 0; e < next.experts; ++e) {
      owners.clear();
      if (e < current.experts)
        for (int i = 0; i < N; ++i)
          if (old[i] >= 0 && have.has(li, old[i], e)) owners.push_back(i);
      bool needed = false;
      for (int i = 0; i < N; ++i) {
        if (!now.has(li, i, e)) continue;
        needed = true;
        if (old[i] >= 0 && have.has(li, old[i], e)) continue;
        int from = -1;  // the owner with the fewest sends so far, the first of them
        for (int o : owners)
          if (from < 0 || sends[o] < sends[from]) from = o;
        if (from >= 0) sends[from]++;
        m.transfers.push_back({li, e, from < 0 ? -1 : physical_ids[from], physical_ids[i]});
        ++moved;
      }
      if (needed && owners.empty()) m.lost.emplace_back(li, e);
    }
    m.moved_per_layer.push_back(moved);
    m.replicas_moved += moved;
  }
  return m;
}

nlohmann::json migration_to_json(const Migration& m, double expert_bytes) {
  nlohmann::json t = nlohmann::json::array();
  for (const auto& x : m.transfers)
    t.push_back({{"layer", x.layer}, {"expert", x.expert}, {"from", x.from}, {"to", x.to}});
  nlohmann::json lost = nlohmann::json::array();
  for (const auto& [l, e] : m.lost) lost.push_back({{"layer", l}, {"expert", e}});
  nlohmann::json j = {{"node_ids", m.node_ids},
                      {"replicas_moved", m.replicas_moved},
                      {"replicas_moved_per_layer", m.moved_per_layer},
                      {"recoverable", m.lost.empty()},
                      {"lost_experts", lost},
                      {"transfers", t}};
  if (expert_bytes > 0) j["bytes_moved"] = expert_bytes * static_cast<double>(m.replicas_moved);
  return j;
}

}  // namespace ucpkit::placement
