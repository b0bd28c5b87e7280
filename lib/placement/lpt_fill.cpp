// Largest-share-first packing (see lpt_fill.h).
#include "placement/lpt_fill.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "placement/load_bits.h"

namespace ucpkit::placement {

namespace {

// (load, gpu): the least loaded open GPU of a node, as one 128-bit number: the bits of the load (a
// load is never negative, so its bits order as its value) above the GPU id. Compares as the pair
// (load, gpu) did, without the branches of comparing doubles (the tournament trees' updates were
// most of packing a layer at 1,024 nodes).
struct Key {
  unsigned __int128 v = 0;
  Key() = default;
  Key(double load, int gpu) : v((static_cast<unsigned __int128>(load_bits(load)) << 32) | static_cast<uint32_t>(gpu)) {}
  int gpu() const { return static_cast<int>(static_cast<uint32_t>(v)); }
  bool operator<(const Key& o) const { return v < o.v; }
  bool operator==(const Key& o) const { return v == o.v; }
  bool operator!=(const Key& o) const { return v != o.v; }
};
const Key kNone{std::numeric_limits<double>::infinity(), std::numeric_limits<int>::max()};
constexpr int kAll = std::numeric_limits<int>::max();  // a level every node is within

// Tournament tree over the nodes: the root is the least key of the leaves.
struct Tournament {
  int P = 1;
  std::vector<Key> tree;
  explicit Tournament(int n) {
    while (P < n) P *= 2;
    tree.assign(2 * P, kNone);
  }
  void set(int n, const Key& k) {
    int j = P + n;
    tree[j] = k;
    for (j /= 2; j >= 1; j /= 2) tree[j].v = std::min(tree[2 * j].v, tree[2 * j + 1].v);
  }
  void build() {
    for (int j = P - 1; j >= 1; --j) tree[j] = std::min(tree[2 * j], tree[2 * j + 1]);
  }
  const Key& root() const { return tree[1]; }
};

struct Packer {
  const Cluster& cl;
  const std::vector<int>& r;
  const std::vector<double>& t;
  std::vector<int>& phy2log;
  const NodeRule rule;
  const bool spread;  // rule != NodeRule::any
  const int N, G, S;
  int distinct = 0;                                        // nodes holding the current expert
  double limit = std::numeric_limits<double>::infinity();  // lpt_pack_below: a GPU above it stops the packing
  bool over = false;
  std::vector<double> load;
  std::vector<int> used, here;  // here: replicas of the current expert on each node
  std::vector<Key> nk;          // every node's least loaded open GPU (kNone when full)
  std::vector<int> cand;

  Packer(const Cluster& c, const std::vector<int>& counts, const std::vector<double>& loads, std::vector<int>& p2l,
         NodeRule rl)
      : cl(c), r(counts), t(loads), phy2log(p2l), rule(rl), spread(rl != NodeRule::any), N(c.nodes), G(c.gpus_per_node),
        S(c.slots_per_gpu), load(c.gpus(), 0.0), used(c.gpus(), 0), here(c.nodes, 0), nk(c.nodes, kNone) {
    for (int p = 0; p < cl.slots(); ++p)
      if (phy2log[p] >= 0) {
        const int g = cl.gpu_of_slot(p), e = phy2log[p];
        load[g] += t[e] / r[e];
        used[g]++;
      }
    for (int n = 0; n < N; ++n) refresh(n);
  }

  void refresh(int n) {
    if (!spread) {
      // Without a node rule every replica comes through the tournament trees, one at a time, and its
      // node's least loaded GPU changes each time: as 128-bit keys without branches (a
      // fifth less time for the plain packing at 1,024 nodes; with the spread rule, whose batched
      // levels refresh other nodes, the branches predict well and this was slower).
      Key best = kNone;
      for (int g = n * G; g < (n + 1) * G; ++g) best.v = std::min(best.v, used[g] < S ? Key{load[g], g}.v : kNone.v);
      nk[n] = best;
      return;
    }
    int best = -1;
    for (int g = n * G; g < (n + 1) * G; ++g)
      if (used[g] < S && (best < 0 || load[g] < load[best])) best = g;
    nk[n] = best < 0 ? kNone : Key{load[best], best};
  }

  void place(int g, int e) {
    int slot = g * S;
    while (phy2log[slot] >= 0) ++slot;
    phy2log[slot] = e;
    load[g] += t[e] / r[e];
    used[g]++;
    over |= load[g] > limit;
    const int n = cl.node_of_gpu(g);
    if (here[n]++ == 0) distinct++;
    refresh(n);
  }

  // Whole levels of expert e from `placed` (a level start, every node with room holding `placed / N`
  // replicas of e) while the level's picks fit on distinct nodes with room: they are then the q
  // least loaded of those nodes, each picked once. Returns the replicas placed so far.
  int batch_levels(int e, int placed) {
    while (placed < r[e] && (rule == NodeRule::levels || placed == 0)) {
      const int q = std::min(r[e] - placed, N);
      cand.clear();
      for (int n = 0; n < N; ++n)
        if (nk[n] != kNone) cand.push_back(n);
      if (static_cast<int>(cand.size()) < q) break;
      auto less = [&](int a, int b) { return nk[a] < nk[b]; };
      if (q < static_cast<int>(cand.size())) std::nth_element(cand.begin(), cand.begin() + (q - 1), cand.end(), less);
      for (int i = 0; i < q; ++i) place(nk[cand[i]].gpu(), e);
      placed += q;
      trees_valid = false;
    }
    return placed;
  }

  // The rest of expert e one replica at a time: the least loaded open GPU on an eligible node (at
  // most `level` replicas of e so far), else anywhere. `open` holds the eligible nodes, `blocked`
  // the others; blocked ones are looked at again only when the level (or the expert) changes. The
  // trees are rebuilt from `nk` after batch_levels placed replicas without them (`trees_valid`).
  Tournament open{0}, blocked{0};
  std::vector<int> blocked_nodes;
  bool trees_valid = false;

  // With NodeRule::new_nodes_first the eligible nodes are those without the expert until every node
  // holds it, then all: `level` is 0, then kAll once `distinct` reaches N.
  void one_at_a_time(int e, int placed) {
    auto level_now = [&] { return rule == NodeRule::levels ? placed / N : distinct == N ? kAll : 0; };
    int level = level_now();
    auto eligible = [&](int n) { return !spread || here[n] <= level; };
    if (!trees_valid) {
      open = Tournament(N);
      blocked = Tournament(N);
      blocked_nodes.clear();
      for (int n = 0; n < N; ++n) {
        if (nk[n] == kNone) continue;
        if (eligible(n)) {
          open.tree[open.P + n] = nk[n];
        } else {
          blocked.tree[blocked.P + n] = nk[n];
          blocked_nodes.push_back(n);
        }
      }
      open.build();
      blocked.build();
      trees_valid = true;
    }
    for (bool first = true; placed < r[e]; ++placed, first = false) {
      if (spread && (first || level_now() != level)) {
        level = level_now();
        size_t kept = 0;
        for (int n : blocked_nodes)
          if (eligible(n)) {
            open.set(n, blocked.tree[blocked.P + n]);
            blocked.set(n, kNone);
          } else {
            blocked_nodes[kept++] = n;
          }
        blocked_nodes.resize(kept);
      }
      Tournament& from = open.root() != kNone ? open : blocked;
      const int g = from.root().gpu(), node = cl.node_of_gpu(g);
      if (&from == &blocked) blocked_nodes.erase(std::find(blocked_nodes.begin(), blocked_nodes.end(), node));
      place(g, e);
      const bool room = nk[node] != kNone, elig = room && eligible(node);
      Tournament& to = elig ? open : blocked;
      if (room && &to == &from) {
        from.set(node, nk[node]);  // one update where the node stays in its tree (always without a rule)
      } else {
        from.set(node, kNone);
        if (room) to.set(node, nk[node]);
      }
      if (room && !elig) blocked_nodes.push_back(node);
    }
  }
};

}  // namespace

namespace {

// lpt_fill, stopping with an empty result as soon as a GPU's load exceeds `limit`.
std::vector<int> fill_below(std::vector<int> phy2log, const std::vector<int>& r, const std::vector<double>& t,
                            const Cluster& cl, NodeRule rule, const std::vector<char>& skip, double limit) {
  require_load_bits_order(t, "lpt_fill");  // Key orders loads by their bits
  const bool spread = rule != NodeRule::any;
  const int E = static_cast<int>(r.size());
  // Experts by share descending (ties by id).
  std::vector<std::pair<double, int>> by_share;
  for (int e = 0; e < E; ++e)
    if (!skip[e] && r[e] > 0) by_share.push_back({-t[e] / r[e], e});
  std::sort(by_share.begin(), by_share.end());
  Packer pk(cl, r, t, phy2log, rule);
  pk.limit = limit;
  for (const auto& [w, e] : by_share) {
    std::fill(pk.here.begin(), pk.here.end(), 0);
    pk.distinct = 0;
    const int placed = spread ? pk.batch_levels(e, 0) : 0;
    if (placed < r[e]) pk.one_at_a_time(e, placed);
    if (pk.over) return {};
  }
  return phy2log;
}

}  // namespace

std::vector<int> lpt_fill(std::vector<int> phy2log, const std::vector<int>& r, const std::vector<double>& t,
                          const Cluster& cl, NodeRule rule, const std::vector<char>& skip) {
  return fill_below(std::move(phy2log), r, t, cl, rule, skip, std::numeric_limits<double>::infinity());
}

std::vector<int> lpt_fill(std::vector<int> phy2log, const std::vector<int>& r, const std::vector<double>& t,
                          const Cluster& cl, bool spread, const std::vector<char>& skip) {
  return lpt_fill(std::move(phy2log), r, t, cl, spread ? NodeRule::levels : NodeRule::any, skip);
}

std::vector<int> lpt_pack(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, NodeRule rule) {
  return lpt_fill(std::vector<int>(cl.slots(), -1), r, t, cl, rule, std::vector<char>(r.size(), 0));
}

std::vector<int> lpt_pack(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, bool spread) {
  return lpt_pack(r, t, cl, spread ? NodeRule::levels : NodeRule::any);
}

std::vector<int> lpt_pack_below(const std::vector<int>& r, const std::vector<double>& t, const Cluster& cl, bool spread,
                                double limit) {
  return fill_below(std::vector<int>(cl.slots(), -1), r, t, cl, spread ? NodeRule::levels : NodeRule::any,
                    std::vector<char>(r.size(), 0), limit);
}

}  // namespace ucpkit::placement
