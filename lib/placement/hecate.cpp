// hecate: heterogeneous sharding + sparse materialization.
#include "placement/hecate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

#include "core/error.h"
#include "placement/algorithm.h"

namespace ucpkit::placement {
namespace {

std::vector<int> by_load_desc(const std::vector<double>& t) {
  std::vector<int> order(t.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return t[a] > t[b]; });
  return order;
}

// The nodes with free slots in place_copy's order for a node lacking the expert: most room first,
// then the largest room of one of its GPUs, then the lowest id (a GPU scan's first maximum), so the
// choice is the first listed node lacking the expert instead of a scan over every GPU (at
// 8,192 GPUs). `taken(g)` after a slot of GPU g is filled.
class RoomIndex {
 public:
  RoomIndex(int nodes, int gpus_per_node, int room)
      : G_(gpus_per_node), room_(nodes * gpus_per_node, room), key_(nodes) {
    for (int n = 0; n < nodes; ++n) {
      key_[n] = {-room * G_, -room, n};
      if (room > 0) order_.insert(key_[n]);
    }
  }
  void taken(int g) {
    const int n = g / G_;
    order_.erase(key_[n]);
    room_[g]--;
    int total = 0, most = 0;
    for (int h = n * G_; h < (n + 1) * G_; ++h) total += room_[h], most = std::max(most, room_[h]);
    key_[n] = {-total, -most, n};
    if (total > 0) order_.insert(key_[n]);
  }
  // The first GPU with the node's largest room.
  int best_gpu(int n) const {
    int best = n * G_;
    for (int h = n * G_; h < (n + 1) * G_; ++h)
      if (room_[h] > room_[best]) best = h;
    return best;
  }
  const std::set<std::tuple<int, int, int>>& nodes() const { return order_; }

 private:
  int G_;
  std::vector<int> room_;
  std::vector<std::tuple<int, int, int>> key_;  // (-node room, -largest GPU room, node)
  std::set<std::tuple<int, int, int>> order_;
};

// place_copy's choice for one expert as a max over nodes (a tournament tree), for a run of copies
// of that expert: a node's key is (lacks the expert, room, its best GPU lacks it, that GPU's room,
// lowest id first), its best GPU the first of the largest (lacks, room). The largest key is the GPU
// place_copy takes: nodes lacking the expert first, in RoomIndex's order, then the scan's order; a
// copy changes one node's key. A dominant expert gets thousands of copies a layer on 1,024 nodes,
// and once it is on every node each place_copy scanned all 8,192 GPUs.
class NodeTree {
 public:
  // room(g), holds(g): the GPU's free slots and whether it holds the expert; lacks(n): no GPU of
  // node n holds it.
  template <class Room, class Holds, class Lacks>
  void build(int nodes, int gpus_per_node, int max_room, const Room& room, const Holds& holds, const Lacks& lacks) {
    N_ = nodes;
    G_ = gpus_per_node;
    M_ = max_room;
    size_ = 1;
    while (size_ < N_) size_ *= 2;
    key_.assign(2 * static_cast<size_t>(size_), -1);
    gpu_.assign(N_, -1);
    for (int n = 0; n < N_; ++n) key_[size_ + n] = node_key(n, room, holds, lacks(n));
    for (int i = size_ - 1; i >= 1; --i) key_[i] = std::max(key_[2 * i], key_[2 * i + 1]);
  }
  // The GPU of the largest key, -1 when no GPU has room.
  int best() const { return key_[1] < 0 ? -1 : gpu_[N_ - 1 - static_cast<int>(key_[1] % N_)]; }
  // After a copy on node n (which then holds the expert).
  template <class Room, class Holds>
  void update(int n, const Room& room, const Holds& holds) {
    size_t i = static_cast<size_t>(size_ + n);
    key_[i] = node_key(n, room, holds, false);
    for (i /= 2; i >= 1; i /= 2) key_[i] = std::max(key_[2 * i], key_[2 * i + 1]);
  }

 private:
  template <class Room, class Holds>
  long long node_key(int n, const Room& room, const Holds& holds, bool lacks) {
    int total = 0, best = -1, best_rank = -1;
    for (int g = n * G_; g < (n + 1) * G_; ++g) {
      const int r = room(g);
      if (r == 0) continue;
      total += r;
      const int rank = (holds(g) ? 0 : M_ + 1) + r;  // (lacks it, room)
      if (rank > best_rank) best = g, best_rank = rank;
    }
    gpu_[n] = best;
    if (total == 0) return -1;
    const long long k = (static_cast<long long>(lacks) * (G_ * M_ + 1) + total) * (2 * M_ + 2) + best_rank;
    return k * N_ + (N_ - 1 - n);
  }
  int N_ = 0, G_ = 0, M_ = 0, size_ = 1;
  std::vector<long long> key_;  // [1, size_): inner maxima; [size_, size_ + N_): the nodes
  std::vector<int> gpu_;        // per node: its best GPU
};

}  // namespace

std::vector<std::vector<int>> hecate_sharding(const LoadMatrix& loads, const Cluster& cluster, int t) {
  const int L = static_cast<int>(loads.layers), E = static_cast<int>(loads.experts);
  const int D = cluster.gpus(), G = cluster.gpus_per_node, N = cluster.nodes;
  t = std::clamp(t, 0, E);
  const long long per_gpu = (1LL * L * E + D - 1) / D;
  std::vector<long long> free(D, per_gpu);
  std::vector<std::vector<int>> owner(L, std::vector<int>(E, -1));
  std::vector<std::vector<int>> overlappable(L);

  std::vector<int> layers(L);
  std::iota(layers.begin(), layers.end(), 0);
  auto max_load = [&](int l) {
    auto row = loads.layer(l);
    return *std::max_element(row.begin(), row.end());
  };
  std::stable_sort(layers.begin(), layers.end(), [&](int a, int b) { return max_load(a) > max_load(b); });
  // Free shard slots per node, kept with `free`: the node scan reads them instead of summing its GPUs.
  std::vector<long long> node_free(N, 0);
  for (int g = 0; g < D; ++g) node_free[g / G] += free[g];
  for (int l : layers) {
    std::vector<double> row = loads.layer_vector(l);
    std::vector<int> order = by_load_desc(row);
    overlappable[l].assign(order.begin(), order.begin() + t);
    std::vector<double> node_load(N, 0.0), gpu_load(D, 0.0);
    for (int i = t; i < E; ++i) {
      int e = order[i];
      int best_node = -1;
      long long best_free = 0;
      for (int n = 0; n < N; ++n) {
        const long long nf = node_free[n];
        if (nf == 0) continue;
        if (best_node < 0 || node_load[n] < node_load[best_node] ||
            (node_load[n] == node_load[best_node] && nf < best_free)) {
          best_node = n;
          best_free = nf;
        }
      }
      int best = -1;
      for (int g = best_node * G; g < (best_node + 1) * G; ++g) {
        if (free[g] == 0) continue;
        if (best < 0 || gpu_load[g] < gpu_load[best] || (gpu_load[g] == gpu_load[best] && free[g] < free[best]))
          best = g;
      }
      owner[l][e] = best;
      free[best]--;
      node_free[best_node]--;
      node_load[best_node] += row[e];
      gpu_load[best] += row[e];
    }
  }
  // Overlappable experts go to the remaining shard slots, GPUs with the most room first (the lowest
  // id on ties, as a scan for the first maximum takes): an ordered set instead of a scan per expert.
  std::set<std::pair<long long, int>> by_room;  // (-free, GPU)
  for (int g = 0; g < D; ++g) by_room.insert({-free[g], g});
  for (int l : layers)
    for (int e : overlappable[l]) {
      const int best = by_room.begin()->second;
      by_room.erase(by_room.begin());
      owner[l][e] = best;
      free[best]--;
      by_room.insert({-free[best], best});
    }
  return owner;
}

namespace {

// One layer's slots as hecate_materialize fills them: who holds what, per node and GPU, and the room left.
class LayerFill {
 public:
  LayerFill(const std::vector<double>& t, const Cluster& cluster, int memory)
      : t_(t), cl_(cluster), E(static_cast<int>(t.size())), D(cluster.gpus()), G(cluster.gpus_per_node),
        S(cluster.slots_per_gpu), M(memory), slots_(D), has_(static_cast<size_t>(E) * D, 0),
        on_node_(static_cast<size_t>(cluster.nodes) * E, 0), nodes_of_(E, 0), cnt_(E, 0), gload_(D, 0.0),
        rooms_(cluster.nodes, G, M) {}

  // Owner shards first: on the owner GPU, else the lightest GPU with room on its node, else anywhere.
  void place_owners(const std::vector<int>& owner, const std::vector<int>& order) {
    for (int e : order) {
      int g = owner[e];
      if (room(g) <= 0) {
        int node = cl_.node_of_gpu(g), best = -1;
        for (int h = node * G; h < (node + 1) * G; ++h)
          if (room(h) > 0 && (best < 0 || gload_[h] < gload_[best])) best = h;
        if (best < 0)
          for (int h = 0; h < D; ++h)
            if (room(h) > 0 && (best < 0 || gload_[h] < gload_[best])) best = h;
        g = best;
      }
      put(e, g);
    }
  }

  // The overlap_degree most loaded experts: on every GPU when they fit the memory, else copies in
  // proportion to their loads.
  void spread_overlapped(const std::vector<int>& order, int overlap_degree, int tree_from) {
    const int free_total = D * M - E;
    int tt = std::clamp(overlap_degree < 0 ? E : overlap_degree, 0, E);
    if (tt > 0 && tt <= M) {
      for (int i = 0; i < tt; ++i)
        for (int g = 0; g < D; ++g)
          if (room(g) > 0 && !holds(g, order[i])) put(order[i], g);
    } else if (tt > 0) {
      double sum = 0;
      for (int i = 0; i < tt; ++i) sum += t_[order[i]];
      for (int i = 0; i < tt && sum > 0; ++i) {
        place_copies(order[i], static_cast<int>(std::floor(free_total * t_[order[i]] / sum)), tree_from);
      }
    }
  }

  // Slots still free: the largest load per replica gets the next copy.
  void fill_free_slots() {
    for (bool placed = true; placed;) {
      placed = false;
      int best = -1;
      for (int e = 0; e < E; ++e)
        if (best < 0 || t_[e] / cnt_[e] > t_[best] / cnt_[best]) best = e;
      if (best >= 0 && place_copy(best)) placed = true;
    }
  }

  // m < S: the plan's other slots repeat experts the GPU already holds; then the placement.
  LayerPlacement finish() {
    for (int g = 0; g < D; ++g)
      while (static_cast<int>(slots_[g].size()) < S) {
        int best = -1;
        for (int e : slots_[g])
          if (best < 0 || t_[e] / cnt_[e] > t_[best] / cnt_[best]) best = e;
        slots_[g].push_back(best);
        cnt_[best]++;
      }
    LayerPlacement out;
    out.phy2log.resize(cl_.slots());
    for (int g = 0; g < D; ++g)
      for (int s = 0; s < S; ++s) out.phy2log[g * S + s] = slots_[g][s];
    out.phyrank = ranks_by_appearance(out.phy2log, E);
    return out;
  }

 private:
  bool holds(int g, int e) const { return has_[static_cast<size_t>(e) * D + g] != 0; }
  int room(int g) const { return M - static_cast<int>(slots_[g].size()); }
  void put(int e, int g) {
    slots_[g].push_back(e);
    if (!holds(g, e) && on_node_[static_cast<size_t>(g / G) * E + e]++ == 0) nodes_of_[e]++;
    has_[static_cast<size_t>(e) * D + g] = 1;
    cnt_[e]++;
    gload_[g] += t_[e];
    rooms_.taken(g);
  }

  // Most room on nodes lacking e, then on GPUs lacking e.
  bool place_copy(int e) {
    if (nodes_of_[e] < cl_.nodes)  // else every node holds e: no need to walk them
      for (const auto& [minus_room, minus_most, n] : rooms_.nodes())
        if (on_node_[static_cast<size_t>(n) * E + e] == 0) {
          put(e, rooms_.best_gpu(n));
          return true;
        }
    // Every node with room holds e: the scan by (node room, GPU lacks e, GPU room).
    int best = -1, best_node_room = -1;
    bool best_node_lacks = false, best_lacks = false;
    for (int n = 0; n < cl_.nodes; ++n) {
      int nr = 0;
      bool lacks = true;
      for (int g = n * G; g < (n + 1) * G; ++g) {
        nr += room(g);
        lacks = lacks && !holds(g, e);
      }
      if (nr == 0) continue;
      for (int g = n * G; g < (n + 1) * G; ++g) {
        if (room(g) == 0) continue;
        bool gl = !holds(g, e);
        auto key = std::make_tuple(lacks, nr, gl, room(g));
        auto cur = std::make_tuple(best_node_lacks, best_node_room, best_lacks, best < 0 ? -1 : room(best));
        if (best < 0 || key > cur) {
          best = g;
          best_node_room = nr;
          best_node_lacks = lacks;
          best_lacks = gl;
        }
      }
    }
    if (best >= 0) put(e, best);
    return best >= 0;
  }

  // `n` copies of e, place_copy's choices (fewer when the slots run out); from `tree_from` copies
  // through NodeTree.
  void place_copies(int e, int n, int tree_from) {
    if (n < tree_from) {
      for (int j = 0; j < n; ++j)
        if (!place_copy(e)) return;
      return;
    }
    auto room_of = [&](int g) { return room(g); };
    auto gpu_holds = [&](int g) { return holds(g, e); };
    tree_.build(cl_.nodes, G, M, room_of, gpu_holds,
                [&](int node) { return on_node_[static_cast<size_t>(node) * E + e] == 0; });
    for (int j = 0; j < n; ++j) {
      const int g = tree_.best();
      if (g < 0) return;
      put(e, g);
      tree_.update(g / G, room_of, gpu_holds);
    }
  }

  const std::vector<double>& t_;
  const Cluster& cl_;
  const int E, D, G, S, M;
  std::vector<std::vector<int>> slots_;
  // [e][g], an expert's GPUs contiguous: place_copy and NodeTree read one expert at a time.
  std::vector<char> has_;
  std::vector<int> on_node_;   // GPUs of a node holding e
  std::vector<int> nodes_of_;  // nodes holding e
  std::vector<int> cnt_;
  std::vector<double> gload_;
  RoomIndex rooms_;
  NodeTree tree_;
};

}  // namespace

LayerPlacement hecate_materialize(const std::vector<double>& t, const std::vector<int>& owner, const Cluster& cluster,
                                  int overlap_degree, int memory, int tree_from) {
  const int E = static_cast<int>(t.size()), D = cluster.gpus(), S = cluster.slots_per_gpu;
  const int M = memory < 0 ? S : memory;
  if (M < 1 || M > S) throw UsageError("--memory must be between 1 and --slots-per-gpu (" + std::to_string(S) + ")");
  if (static_cast<long long>(D) * M < E)
    throw UsageError(std::to_string(E) + " experts do not fit " + std::to_string(D) + " GPUs x --memory " +
                     std::to_string(M));
  LayerFill fill(t, cluster, M);
  const std::vector<int> order = by_load_desc(t);
  fill.place_owners(owner, order);
  fill.spread_overlapped(order, overlap_degree, tree_from);
  fill.fill_free_slots();
  return fill.finish();
}

namespace {

class Hecate : public PlacementAlgorithm {
 public:
  std::string name() const override { return "hecate"; }
  std::string description() const override { return "Hecate heterogeneous sharding + sparse materialization"; }
  PlacementResult place(const LoadMatrix& loads, const Cluster& cluster, const PlacementOptions& opt) const override {
    check_fits(loads, cluster);
    const int E = static_cast<int>(loads.experts);
    int t = opt.overlap_degree < 0 ? E : std::min(opt.overlap_degree, E);
    const int m = opt.memory < 0 ? cluster.slots_per_gpu : opt.memory;
    if (m < 1 || m > cluster.slots_per_gpu)
      throw UsageError("--memory must be between 1 and --slots-per-gpu (" + std::to_string(cluster.slots_per_gpu) +
                       ")");
    auto owner = hecate_sharding(loads, cluster, t);
    PlacementResult res;
    for (size_t l = 0; l < loads.layers; ++l)
      res.layers.push_back(hecate_materialize(loads.layer_vector(l), owner[l], cluster, t, m));
    res.details["overlap_degree"] = t;
    res.details["memory"] = m;
    res.details["shards_per_gpu"] = (1LL * loads.layers * E + cluster.gpus() - 1) / cluster.gpus();
    res.details["shard_owner"] = owner;
    return res;
  }
};

const AlgorithmRegistrar kHecateRegistrar("hecate", [] { return std::make_unique<Hecate>(); });

}  // namespace
}  // namespace ucpkit::placement
