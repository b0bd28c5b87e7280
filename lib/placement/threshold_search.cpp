// Threshold search (see threshold_search.h).
#include "placement/threshold_search.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ucpkit::placement {

namespace {

// splitmix64: the same sequence on every platform (std's distributions are not specified exactly).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  int below(int n) { return static_cast<int>(next() % static_cast<uint64_t>(n)); }
};

// A rewrite updates every GPU holding either expert: not tried when they hold more than this
// together (a hot expert with hundreds of replicas changes its share by a fraction of a percent).
constexpr int kMaxRewriteReplicas = 256;

class Search {
 public:
  Search(const std::vector<int>& p, const std::vector<double>& t, const Cluster& cl, int f)
      : cl_(cl), t_(t), E_(static_cast<int>(t.size())), n_(cl.slots()), m_(cl.gpus()), S_(cl.slots_per_gpu),
        N_(cl.nodes), p_(p) {
    r_.assign(E_, 0);
    nodecnt_.assign(static_cast<size_t>(E_) * N_, 0);
    distinct_.assign(E_, 0);
    slots_of_.assign(E_, {});
    pos_.assign(n_, 0);
    for (int q = 0; q < n_; ++q) {
      const int e = p_[q];
      r_[e]++;
      if (nodecnt_[static_cast<size_t>(e) * N_ + node(q)]++ == 0) distinct_[e]++;
      pos_[q] = static_cast<int>(slots_of_[e].size());
      slots_of_[e].push_back(q);
    }
    need_.resize(E_);
    min_count_.resize(E_);
    for (int e = 0; e < E_; ++e) {
      need_[e] = std::min(f, distinct_[e]);
      min_count_[e] = std::min(f, r_[e]);
    }
    load_.assign(m_, 0.0);
    for (int q = 0; q < n_; ++q) load_[q / S_] += share(p_[q]);
    delta_.assign(m_, 0.0);
    mark_.assign(m_, 0);
    over_pos_.assign(m_, -1);
  }

  const std::vector<int>& phy2log() const { return p_; }
  double max_load() const { return *std::max_element(load_.begin(), load_.end()); }

  // Anneals against threshold T for `iterations` moves or until no GPU is above T.
  void anneal(double T, long long iterations, double mean, Rng& rng) {
    set_threshold(T);
    double temp = mean * 2e-3;
    const double cool = std::pow(1e-5 / 2e-3, 1.0 / static_cast<double>(std::max<long long>(1, iterations)));
    for (long long it = 0; it < iterations && !over_.empty(); ++it, temp *= cool) {
      const int a = !over_.empty() && rng.unit() < 0.8
                        ? over_[rng.below(static_cast<int>(over_.size()))] * S_ + rng.below(S_)
                        : rng.below(n_);
      if (rng.unit() < 0.3) {
        const int to = rng.below(E_);
        double d;
        if (!try_rewrite(a, to, &d)) continue;
        if (d <= 0 || rng.unit() < std::exp(-d / temp)) {
          apply_rewrite(a, to);
        } else {
          clear_delta();
        }
      } else {
        const int b = rng.below(n_);
        double d;
        if (!try_swap(a, b, &d)) continue;
        if (d <= 0 || rng.unit() < std::exp(-d / temp)) apply_swap(a, b);
      }
    }
  }

 private:
  int node(int q) const { return q / cl_.slots_per_node(); }
  double share(int e) const { return t_[e] / r_[e]; }
  double excess(double l) const { return l > T_ ? l - T_ : 0.0; }
  int& cnt(int e, int nd) { return nodecnt_[static_cast<size_t>(e) * N_ + nd]; }

  void set_threshold(double T) {
    T_ = T;
    over_.clear();
    std::fill(over_pos_.begin(), over_pos_.end(), -1);
    for (int g = 0; g < m_; ++g) update_over(g);
  }
  void update_over(int g) {
    const bool over = load_[g] > T_;
    if (over && over_pos_[g] < 0) {
      over_pos_[g] = static_cast<int>(over_.size());
      over_.push_back(g);
    } else if (!over && over_pos_[g] >= 0) {
      const int k = over_pos_[g], last = over_.back();
      over_[k] = last;
      over_pos_[last] = k;
      over_.pop_back();
      over_pos_[g] = -1;
    }
  }
  // Slot q changes from expert `from` to `to` (bookkeeping only, no loads).
  void relabel(int q, int from, int to) {
    const int k = pos_[q], last = slots_of_[from].back();
    slots_of_[from][k] = last;
    pos_[last] = k;
    slots_of_[from].pop_back();
    pos_[q] = static_cast<int>(slots_of_[to].size());
    slots_of_[to].push_back(q);
    if (--cnt(from, node(q)) == 0) distinct_[from]--;
    if (cnt(to, node(q))++ == 0) distinct_[to]++;
    p_[q] = to;
  }

  bool try_swap(int a, int b, double* d) {
    const int ea = p_[a], eb = p_[b], ga = a / S_, gb = b / S_;
    if (ea == eb || ga == gb) return false;
    const int na = node(a), nb = node(b);
    if (na != nb) {  // a node set shrinks when the moved replica was the only one there and the target had one
      if (cnt(ea, na) == 1 && cnt(ea, nb) > 0 && distinct_[ea] <= need_[ea]) return false;
      if (cnt(eb, nb) == 1 && cnt(eb, na) > 0 && distinct_[eb] <= need_[eb]) return false;
    }
    const double x = share(eb) - share(ea);
    *d = excess(load_[ga] + x) - excess(load_[ga]) + excess(load_[gb] - x) - excess(load_[gb]);
    return true;
  }
  void apply_swap(int a, int b) {
    const int ea = p_[a], eb = p_[b], ga = a / S_, gb = b / S_;
    const double x = share(eb) - share(ea);
    load_[ga] += x;
    load_[gb] -= x;
    update_over(ga);
    update_over(gb);
    relabel(a, ea, eb);
    relabel(b, eb, ea);
  }

  void add_delta(int g, double x) {
    if (!mark_[g]) {
      mark_[g] = 1;
      touched_.push_back(g);
      delta_[g] = 0;
    }
    delta_[g] += x;
  }
  void clear_delta() {
    for (int g : touched_) mark_[g] = 0;
    touched_.clear();
  }
  // Slot a becomes a replica of `to`: a's expert loses one (every GPU holding it carries a larger
  // share), `to` gains one (a smaller share). Leaves the GPU changes in delta_ for apply_rewrite.
  bool try_rewrite(int a, int to, double* d) {
    const int from = p_[a];
    if (from == to || r_[from] - 1 < min_count_[from]) return false;
    if (r_[from] + r_[to] > kMaxRewriteReplicas) return false;  // each move's cost grows with the replicas
    if (cnt(from, node(a)) == 1 && distinct_[from] <= need_[from]) return false;
    const double s0 = share(from), s1 = t_[from] / (r_[from] - 1), u0 = share(to), u1 = t_[to] / (r_[to] + 1);
    for (int q : slots_of_[from]) add_delta(q / S_, q == a ? -s0 : s1 - s0);
    for (int q : slots_of_[to]) add_delta(q / S_, u1 - u0);
    add_delta(a / S_, u1);
    *d = 0;
    for (int g : touched_) *d += excess(load_[g] + delta_[g]) - excess(load_[g]);
    return true;
  }
  void apply_rewrite(int a, int to) {
    for (int g : touched_) {
      load_[g] += delta_[g];
      mark_[g] = 0;
      update_over(g);
    }
    touched_.clear();
    const int from = p_[a];
    r_[from]--;
    r_[to]++;
    relabel(a, from, to);
  }

  const Cluster& cl_;
  const std::vector<double>& t_;
  int E_, n_, m_, S_, N_;
  std::vector<int> p_, r_, nodecnt_, distinct_, pos_, need_, min_count_;
  std::vector<std::vector<int>> slots_of_;
  std::vector<double> load_, delta_;
  std::vector<char> mark_;
  std::vector<int> touched_, over_, over_pos_;
  double T_ = 0;
};

}  // namespace

std::vector<int> threshold_search(const std::vector<int>& phy2log, const std::vector<double>& t, const Cluster& cl,
                                  int f, double goal, const ThresholdSearchLimits& limits) {
  const int E = static_cast<int>(t.size());
  if (E == 0 || static_cast<int>(phy2log.size()) != cl.slots()) return phy2log;
  for (int e : phy2log)
    if (e < 0 || e >= E) return phy2log;
  double total = 0;
  for (double x : t) total += x;
  const double mean = total / cl.gpus();
  if (!(mean > 0)) return phy2log;
  Search start(phy2log, t, cl, f);
  std::vector<int> best = phy2log;
  double best_max = start.max_load();
  const double first_max = best_max;
  Rng rng{0x5EED31ULL};
  double T = goal;
  for (int attempt = 0; attempt < limits.attempts && T < best_max; ++attempt) {
    Search s(best, t, cl, f);
    s.anneal(T, limits.iterations, mean, rng);
    const double mx = s.max_load();
    if (mx < best_max) {
      best_max = mx;
      best = s.phy2log();
    }
    if (mx <= goal) break;
    // The step toward the goal reached: the goal again from there; missed: halfway to it.
    T = mx <= T ? goal : goal + (best_max - goal) / 2;
  }
  return best_max < first_max * (1 - 1e-12) ? best : phy2log;
}

}  // namespace ucpkit::placement
