// Mutable layer placement and the local searches on it.
#include "placement/layer_state.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "core/error.h"

namespace ucpkit::placement {

LayerState::LayerState(const Cluster& cluster, std::vector<double> loads, std::vector<int> phy2log)
    : cluster_(cluster), experts_(static_cast<int>(loads.size())), t_(std::move(loads)), phy2log_(std::move(phy2log)) {
  if (static_cast<int>(phy2log_.size()) != cluster_.slots()) throw Error("internal: layer state of the wrong size");
  cnt_.assign(experts_, 0);
  distinct_.assign(experts_, 0);
  nodecnt_.assign(static_cast<size_t>(experts_) * cluster_.nodes, 0);
  slots_of_.assign(experts_, {});
  for (int p = 0; p < cluster_.slots(); ++p) {
    int e = phy2log_[p];
    cnt_[e]++;
    slots_of_[e].push_back(p);
    add_node(e, cluster_.node_of_slot(p), 1);
  }
  load_.assign(cluster_.gpus(), 0.0);
  for (int p = 0; p < cluster_.slots(); ++p) load_[cluster_.gpu_of_slot(p)] += share(phy2log_[p]);
  for (int g = 0; g < cluster_.gpus(); ++g) order_.insert({load_[g], g});
}

void LayerState::add_load(int gpu, double delta) {
  order_.erase({load_[gpu], gpu});
  load_[gpu] += delta;
  order_.insert({load_[gpu], gpu});
}

void LayerState::add_node(int e, int node, int delta) {
  int& c = nodecnt_[static_cast<size_t>(e) * cluster_.nodes + node];
  if (c == 0 && delta > 0) distinct_[e]++;
  c += delta;
  if (c == 0 && delta < 0) distinct_[e]--;
}


int LayerState::distinct_after_move(int x, int a, int b) const {
  if (a == b) return distinct_[x];
  return distinct_[x] - (on_node(x, a) == 1 ? 1 : 0) + (on_node(x, b) == 0 ? 1 : 0);
}

void LayerState::swap_slots(int p, int q) {
  int x = phy2log_[p], y = phy2log_[q];
  if (x == y) return;
  int gp = cluster_.gpu_of_slot(p), gq = cluster_.gpu_of_slot(q);
  add_load(gp, share(y) - share(x));
  add_load(gq, share(x) - share(y));
  int np = cluster_.node_of_slot(p), nq = cluster_.node_of_slot(q);
  add_node(x, nq, 1);
  add_node(x, np, -1);
  add_node(y, np, 1);
  add_node(y, nq, -1);
  std::replace(slots_of_[x].begin(), slots_of_[x].end(), p, q);
  std::replace(slots_of_[y].begin(), slots_of_[y].end(), q, p);
  phy2log_[p] = y;
  phy2log_[q] = x;
}

void LayerState::set_slot(int p, int e) {
  int x = phy2log_[p];
  if (x == e) return;
  for (int s : slots_of_[x]) add_load(cluster_.gpu_of_slot(s), -share(x));
  for (int s : slots_of_[e]) add_load(cluster_.gpu_of_slot(s), -share(e));
  slots_of_[x].erase(std::find(slots_of_[x].begin(), slots_of_[x].end(), p));
  slots_of_[e].push_back(p);
  cnt_[x]--;
  cnt_[e]++;
  add_node(x, cluster_.node_of_slot(p), -1);
  add_node(e, cluster_.node_of_slot(p), 1);
  phy2log_[p] = e;
  for (int s : slots_of_[x]) add_load(cluster_.gpu_of_slot(s), share(x));
  for (int s : slots_of_[e]) add_load(cluster_.gpu_of_slot(s), share(e));
}

namespace {

// The GPUs a swap partner is looked for on: all of them on small clusters, else the lightest 64.
std::vector<int> light_gpus(const LayerState& st, size_t limit) {
  std::vector<int> out;
  for (auto it = st.gpus_by_load().begin(); it != st.gpus_by_load().end() && out.size() < limit; ++it)
    out.push_back(it->second);
  return out;
}

bool keeps_guarantee(const LayerState& st, int f, int x, int from_node, int to_node) {
  return st.distinct_after_move(x, from_node, to_node) >= std::min(f, st.distinct(x));
}

}  // namespace

std::optional<LayerMove> best_swap(const LayerState& st, int f) {
  const Cluster& cl = st.cluster();
  const int S = cl.slots_per_gpu;
  int g = st.argmax_gpu();
  double M = st.load(g);
  double best = M - 1e-9 * std::max(1.0, M);
  std::optional<LayerMove> out;
  for (int h : light_gpus(st, 64)) {
    if (h == g) continue;
    const int a = cl.node_of_gpu(g), b = cl.node_of_gpu(h);
    for (int sp = 0; sp < S; ++sp) {
      int p = g * S + sp, x = st.phy2log()[p];
      for (int sq = 0; sq < S; ++sq) {
        int q = h * S + sq, y = st.phy2log()[q];
        double d = st.share(x) - st.share(y);
        if (d <= 0) continue;
        double worst = std::max(M - d, st.load(h) + d);
        if (worst >= best) continue;
        if (!keeps_guarantee(st, f, x, a, b) || !keeps_guarantee(st, f, y, b, a)) continue;
        best = worst;
        out = LayerMove{false, p, q, worst};
      }
    }
  }
  return out;
}

std::optional<LayerMove> best_rewrite(const LayerState& st, int f) {
  const Cluster& cl = st.cluster();
  const int S = cl.slots_per_gpu, E = st.experts();
  int g = st.argmax_gpu();
  double M = st.load(g);
  double best = M - 1e-9 * std::max(1.0, M);
  std::vector<int> hot(E);
  std::iota(hot.begin(), hot.end(), 0);
  const size_t top = std::min<size_t>(16, hot.size());
  std::partial_sort(hot.begin(), hot.begin() + top, hot.end(),
                    [&](int a, int b) { return st.share(a) > st.share(b) || (st.share(a) == st.share(b) && a < b); });
  hot.resize(top);
  std::vector<double> delta(cl.gpus(), 0.0);
  std::optional<LayerMove> out;
  for (int sp = 0; sp < S; ++sp) {
    const int p = g * S + sp, x = st.phy2log()[p];
    if (st.count(x) <= f || st.distinct_after_remove(x, cl.node_of_slot(p)) < std::min(f, st.distinct(x))) continue;
    const double tx = st.expert_load(x), rx = st.count(x);
    const double dx = tx / (rx - 1) - tx / rx;  // every other holder of x carries this much more
    for (int e : hot) {
      if (e == x) continue;
      const double te = st.expert_load(e), re = st.count(e);
      const double de = te / re - te / (re + 1);  // every holder of e carries this much less
      double worst = st.load(g) - tx / rx + te / (re + 1);
      // GPU g may also hold other replicas of x (+dx each) or e (-de each).
      for (int s : st.slots_of(x))
        if (s != p) delta[cl.gpu_of_slot(s)] += dx;
      for (int s : st.slots_of(e)) delta[cl.gpu_of_slot(s)] -= de;
      worst += delta[g];
      for (int s : st.slots_of(x)) {
        int h = cl.gpu_of_slot(s);
        if (h != g) worst = std::max(worst, st.load(h) + delta[h]);
      }
      for (int s : st.slots_of(x)) delta[cl.gpu_of_slot(s)] = 0;
      for (int s : st.slots_of(e)) delta[cl.gpu_of_slot(s)] = 0;
      if (worst < best) {
        best = worst;
        out = LayerMove{true, p, e, worst};
      }
    }
  }
  // The other direction: a slot on one of the 16 lightest GPUs (whose expert y keeps its guarantee)
  // becomes another replica of an expert x of the most loaded GPU, so every holder of x sheds load.
  for (int h : light_gpus(st, 16)) {
    if (h == g) continue;
    for (int sq = 0; sq < S; ++sq) {
      const int q = h * S + sq, y = st.phy2log()[q];
      if (st.count(y) <= f || st.distinct_after_remove(y, cl.node_of_slot(q)) < std::min(f, st.distinct(y))) continue;
      const double ty = st.expert_load(y), ry = st.count(y);
      const double dy = ty / (ry - 1) - ty / ry;
      for (int sp = 0; sp < S; ++sp) {
        const int x = st.phy2log()[g * S + sp];
        if (x == y) continue;
        const double tx = st.expert_load(x), rx = st.count(x);
        const double dx = tx / rx - tx / (rx + 1);
        for (int s : st.slots_of(x)) delta[cl.gpu_of_slot(s)] -= dx;
        for (int s : st.slots_of(y))
          if (s != q) delta[cl.gpu_of_slot(s)] += dy;
        double worst = st.load(h) - ty / ry + tx / (rx + 1) + delta[h];
        for (int s : st.slots_of(x)) worst = std::max(worst, st.load(cl.gpu_of_slot(s)) + delta[cl.gpu_of_slot(s)]);
        for (int s : st.slots_of(y)) worst = std::max(worst, st.load(cl.gpu_of_slot(s)) + delta[cl.gpu_of_slot(s)]);
        for (int s : st.slots_of(x)) delta[cl.gpu_of_slot(s)] = 0;
        for (int s : st.slots_of(y)) delta[cl.gpu_of_slot(s)] = 0;
        delta[h] = 0;
        if (worst < best) {
          best = worst;
          out = LayerMove{true, q, x, worst};
        }
      }
    }
  }
  return out;
}

void apply_move(LayerState& st, const LayerMove& m) {
  if (m.rewrite)
    st.set_slot(m.p, m.q);
  else
    st.swap_slots(m.p, m.q);
}

int reduce_max(LayerState& st, int f, int max_moves, bool rewrites) {
  int n = 0;
  for (; n < max_moves; ++n) {
    // Swaps first (cheap to evaluate); a rewrite only when no swap helps.
    std::optional<LayerMove> m = best_swap(st, f);
    if (!m && rewrites) m = best_rewrite(st, f);
    if (!m) break;
    apply_move(st, *m);
  }
  return n;
}

std::vector<std::pair<int, int>> repair_fault_tolerance(LayerState& st, int f) {
  const Cluster& cl = st.cluster();
  std::vector<std::pair<int, int>> done;
  for (int e = 0; e < st.experts(); ++e) {
    while (st.distinct(e) < std::min({f, st.count(e), cl.nodes})) {
      int bp = -1, bq = -1;
      double best = 0;
      // Partners on the 64 lightest GPUs first, on every GPU when none of those fits.
      std::vector<int> partners;
      for (int h : light_gpus(st, 64))
        for (int s = 0; s < cl.slots_per_gpu; ++s) partners.push_back(h * cl.slots_per_gpu + s);
      for (int pass = 0; pass < 2 && bp < 0; ++pass) {
      if (pass == 1) {
        partners.resize(cl.slots());
        std::iota(partners.begin(), partners.end(), 0);
      }
      for (int p : st.slots_of(e)) {
        int a = cl.node_of_slot(p);
        if (st.on_node(e, a) < 2) continue;
        for (int q : partners) {
          int b = cl.node_of_slot(q), y = st.phy2log()[q];
          if (st.on_node(e, b) > 0 || y == e) continue;
          if (st.distinct_after_move(y, b, a) < std::min(f, st.distinct(y))) continue;
          double d = st.share(e) - st.share(y);
          double worst = std::max(st.load(cl.gpu_of_slot(p)) - d, st.load(cl.gpu_of_slot(q)) + d);
          if (bp < 0 || worst < best) {
            best = worst;
            bp = p;
            bq = q;
          }
        }
      }
      }
      if (bp < 0) throw Error("internal: no swap gives expert " + std::to_string(e) + " " + std::to_string(f) + " nodes");
      st.swap_slots(bp, bq);
      done.emplace_back(bp, bq);
    }
  }
  return done;
}

std::pair<int, int> overlap_node_sets(LayerState& st, int f, double max_load) {
  const Cluster& cl = st.cluster();
  const double cap = max_load * (1 + 1e-12);
  auto node_set = [&](int e) {
    std::vector<int> s;
    for (int p : st.slots_of(e)) s.push_back(cl.node_of_slot(p));
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return s;
  };
  std::map<std::vector<int>, std::vector<int>> groups;
  for (int e = 0; e < st.experts(); ++e)
    if (st.distinct(e) == f) groups[node_set(e)].push_back(e);
  const int before = static_cast<int>(groups.size());
  std::vector<std::vector<int>> keys;
  for (const auto& [k, v] : groups) keys.push_back(k);
  // Largest groups are the targets; the smallest move first.
  std::stable_sort(keys.begin(), keys.end(), [&](const auto& a, const auto& b) { return groups[a].size() > groups[b].size(); });
  std::vector<char> gone(keys.size(), 0);
  for (size_t src = keys.size(); src-- > 1;) {
    const auto& A = keys[src];
    bool movable = true;
    for (int e : groups[A]) movable = movable && st.count(e) == f;  // one replica per node
    if (!movable) continue;
    int tries = 0;
    for (size_t dst = 0; dst < src && tries < 8; ++dst) {
      if (gone[dst]) continue;
      ++tries;
      const auto& B = keys[dst];
      std::vector<int> from, to;
      std::set_difference(A.begin(), A.end(), B.begin(), B.end(), std::back_inserter(from));
      std::set_difference(B.begin(), B.end(), A.begin(), A.end(), std::back_inserter(to));
      std::vector<std::pair<int, int>> undo;
      bool ok = true;
      for (int e : groups[A]) {
        for (size_t i = 0; i < from.size() && ok; ++i) {
          int p = -1;
          for (int s : st.slots_of(e))
            if (cl.node_of_slot(s) == from[i]) p = s;
          int bq = -1;
          double best = 0;
          const int gp = cl.gpu_of_slot(p);
          for (int q = to[i] * cl.slots_per_node(); q < (to[i] + 1) * cl.slots_per_node(); ++q) {
            int y = st.phy2log()[q];
            if (y == e || st.distinct(y) <= f || st.distinct_after_move(y, to[i], from[i]) <= f) continue;
            double d = st.share(e) - st.share(y);
            double worst = std::max(st.load(gp) - d, st.load(cl.gpu_of_slot(q)) + d);
            if (worst > cap) continue;
            if (bq < 0 || worst < best) {
              best = worst;
              bq = q;
            }
          }
          if (bq < 0) {
            ok = false;
            break;
          }
          st.swap_slots(p, bq);
          undo.emplace_back(p, bq);
        }
        if (!ok) break;
      }
      if (ok) {
        auto& target = groups[B];
        target.insert(target.end(), groups[A].begin(), groups[A].end());
        gone[src] = 1;
        break;
      }
      for (auto it = undo.rbegin(); it != undo.rend(); ++it) st.swap_slots(it->first, it->second);
    }
  }
  std::set<std::vector<int>> sets;
  for (int e = 0; e < st.experts(); ++e)
    if (st.distinct(e) == f) sets.insert(node_set(e));
  return {before, static_cast<int>(sets.size())};
}

}  // namespace ucpkit::placement
