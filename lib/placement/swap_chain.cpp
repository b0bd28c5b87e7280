// Swap chains on small clusters (see swap_chain.h).
#include "placement/swap_chain.h"

#include <algorithm>

namespace ucpkit::placement {

std::vector<int> swap_chain_improve(std::vector<int> p, const std::vector<double>& t, const Cluster& cl, int f,
                                    int max_rounds) {
  const int n = cl.slots(), S = cl.slots_per_gpu, E = static_cast<int>(t.size()), N = cl.nodes;
  std::vector<int> r(E, 0);
  for (int e : p) {
    if (e < 0 || e >= E) return p;  // an unfilled slot: not this step's business
    r[e]++;
  }
  std::vector<double> load(cl.gpus(), 0.0);
  std::vector<std::vector<int>> on(E, std::vector<int>(N, 0));  // replicas of e per node
  std::vector<int> distinct(E, 0);
  for (int q = 0; q < n; ++q) {
    load[q / S] += t[p[q]] / r[p[q]];
    if (on[p[q]][cl.node_of_slot(q)]++ == 0) distinct[p[q]]++;
  }
  std::vector<int> need(E);  // f, or what the expert had (never made worse)
  for (int e = 0; e < E; ++e) need[e] = std::min(f, distinct[e]);
  auto share = [&](int q) { return t[p[q]] / r[p[q]]; };
  auto swap_slots = [&](int a, int b) {
    const int ea = p[a], eb = p[b], na = cl.node_of_slot(a), nb = cl.node_of_slot(b);
    const double sa = share(a), sb = share(b);
    if (--on[ea][na] == 0) distinct[ea]--;
    if (--on[eb][nb] == 0) distinct[eb]--;
    if (on[ea][nb]++ == 0) distinct[ea]++;
    if (on[eb][na]++ == 0) distinct[eb]++;
    load[a / S] += sb - sa;
    load[b / S] += sa - sb;
    std::swap(p[a], p[b]);
  };
  auto ok = [&](int e) { return distinct[e] >= need[e]; };
  for (int round = 0; round < max_rounds; ++round) {
    const int top = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    const double M = load[top], below = M * (1 - 1e-12);
    bool applied = false;
    for (int a = top * S; a < (top + 1) * S && !applied; ++a)
      for (int b = 0; b < n && !applied; ++b) {
        if (b / S == top || p[a] == p[b]) continue;
        const double sa = share(a), sb = share(b);
        if (sb >= sa || load[b / S] - sb + sa >= below) continue;
        const int ea = p[a], eb = p[b];
        swap_slots(a, b);
        if (ok(ea) && ok(eb)) {
          applied = true;
          break;
        }
        // A second swap, moving a replica of a broken expert, that restores f for both and keeps
        // every GPU it touches below M.
        for (int c = 0; c < n && !applied; ++c) {
          if (c == a || c == b || (p[c] != ea && p[c] != eb) || ok(p[c])) continue;
          for (int d = 0; d < n && !applied; ++d) {
            if (d == a || d == b || d == c || p[d] == p[c]) continue;
            const int ec = p[c], ed = p[d];
            swap_slots(c, d);
            if (ok(ea) && ok(eb) && ok(ec) && ok(ed) && load[c / S] < below && load[d / S] < below &&
                load[top] < below && load[b / S] < below) {
              applied = true;
            } else {
              swap_slots(c, d);
            }
          }
        }
        if (!applied) swap_slots(a, b);
      }
    if (!applied) break;
  }
  return p;
}

}  // namespace ucpkit::placement
