// Migration-aware re-placement (see replace.h and docs/moe-replace.md).
#include "placement/replace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#ifdef __SSE2__
#include <immintrin.h>
#endif
#include <functional>
#include <limits>
#include <numeric>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "placement/algorithm.h"
#include "placement/balance.h"
#include "placement/balanced_ft.h"
#include "placement/layer_state.h"
#include "placement/migration.h"

namespace ucpkit::placement {
namespace {

// Replicas GPU slots `a` and `b` (S slots each) have in common, as multisets.
int matched_slots(const int* a, const int* b, int S) {
  int matched = 0;
#ifdef __SSE2__
  if (S == 4) {
    // Each slot of b takes the first unused equal slot of a, its four comparisons as one bit mask
    // (aligning a from-scratch placement at 1,024 nodes calls this 4 million times, a twentieth of
    // --previous): the same count as the loop below.
    const __m128i va = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    unsigned used = 0;
    for (int x = 0; x < 4; ++x) {
      const unsigned eq = static_cast<unsigned>(
                              _mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(va, _mm_set1_epi32(b[x]))))) &
                          ~used;
      used |= eq & (~eq + 1);  // the lowest one: the first unused equal slot
      matched += eq != 0;
    }
    return matched;
  }
#endif
  if (S <= 64) {
    uint64_t used = 0;
    for (int x = 0; x < S; ++x)
      for (int y = 0; y < S; ++y)
        if (!((used >> y) & 1) && a[y] == b[x]) {
          used |= uint64_t{1} << y;
          ++matched;
          break;
        }
    return matched;
  }
  std::vector<char> used(S, 0);
  for (int x = 0; x < S; ++x)
    for (int y = 0; y < S; ++y)
      if (!used[y] && a[y] == b[x]) {
        used[y] = 1;
        ++matched;
        break;
      }
  return matched;
}

// Copies GPU g needs: its slots in `after` not matched by a slot of the same expert in `before`.
int gpu_copies(const std::vector<int>& before, const std::vector<int>& after, int g, int S) {
  const size_t at = static_cast<size_t>(g) * S;
  return S - matched_slots(before.data() + at, after.data() + at, S);
}

// Experts with fewer than f replicas take slots from experts that keep at least f replicas and
// min(f, their distinct nodes) nodes, on a node lacking the expert, least loaded GPU first; when no
// such slot is on a node lacking it (after node loss, with exactly f replicas' worth of slots, the
// only spare replicas may sit where the expert is), on any node: repair_fault_tolerance spreads it.
void raise_counts(LayerState& st, int f) {
  const Cluster& cl = st.cluster();
  for (int e = 0; e < st.experts(); ++e)
    while (st.count(e) < std::min(f, cl.slots())) {
      int best = -1;
      for (int pass = 0; pass < 2 && best < 0; ++pass)
        for (int q = 0; q < cl.slots(); ++q) {
          int y = st.phy2log()[q], n = cl.node_of_slot(q);
          if (y == e || st.count(y) <= f || st.distinct_after_remove(y, n) < std::min(f, st.distinct(y))) continue;
          if (pass == 0 && st.on_node(e, n) > 0 && st.distinct(e) < std::min(f, cl.nodes)) continue;
          if (best < 0 || st.load(cl.gpu_of_slot(q)) < st.load(cl.gpu_of_slot(best))) best = q;
        }
      if (best < 0) throw Error("internal: no slot can be freed to give expert " + std::to_string(e) + " f replicas");
      st.set_slot(best, e);
    }
}

// Up to this many nodes align_to pairs nodes by an optimal assignment (Hungarian, O(N^3): 0.6 s per
// layer at 1,024 nodes, 38 s for 64 layers); above, greedily.
constexpr int kExactAlignmentNodes = kLargeClusterNodes;

}  // namespace

// Rows to columns, cheapest pair first (costs 0..max_cost, ties by row then column), each row and
// column once: at most O(N^2), a 2-approximation of the optimal assignment's saving. `cost` is the
// n x n matrix row by row. Cost by cost, each row not yet paired takes its first free column of that
// cost: the same pairs as walking all pairs in (cost, row, column) order. Each row's columns of each
// cost are kept as bits (a row's costs in a few KB, in cache), so the first free one is a few word
// operations against the bits of the columns taken (this pass, 2026-11-25; the fifth pass ordered
// each row's columns by cost with a counting sort, 4 MB of scattered writes per layer at 1,024 nodes;
// the fourth sorted all n^2 pairs into one array, and before that pushed them into a vector per cost).
std::vector<int> greedy_assignment(const std::vector<int>& cost, int n, int max_cost) {
  // Columns of the largest cost are not kept: a row still unpaired at that cost takes its first free
  // column, which has that cost (a free column of a lower cost would have been taken at its cost).
  // Most columns of a row have the largest cost (nodes sharing no expert); setting their bits one by
  // one into the same word was most of this function.
  const size_t V = static_cast<size_t>(std::max(0, max_cost)), N = static_cast<size_t>(n), W = (N + 63) / 64;
  std::vector<uint64_t> bits(N * V * W, 0);  // [row][cost below max_cost][column / 64]
  // Per row, the costs below max_cost it has a column of (as bits, up to 64 of them; all set above):
  // a row is offered only the costs it has.
  std::vector<uint64_t> has(N, V > 64 ? ~uint64_t{0} : 0);
  for (size_t i = 0; i < N; ++i) {
    const int* row = cost.data() + i * N;
    uint64_t* b = bits.data() + i * V * W;
    uint64_t h = 0;
    for (size_t q = 0; q < N; ++q) {
      const int v = std::max(row[q], 0);
      if (v < max_cost) {
        b[static_cast<size_t>(v) * W + (q >> 6)] |= uint64_t{1} << (q & 63);
        h |= uint64_t{1} << (v & 63);
      }
    }
    if (V <= 64) has[i] = h;
  }
  std::vector<int> col(n, -1);
  std::vector<uint64_t> taken(W, 0);
  int left = n;
  auto take = [&](size_t i, const uint64_t* m) {  // the first free column among m's (all free ones when null)
    for (size_t w = 0; w < W; ++w) {
      uint64_t free = ~taken[w];
      if (m) free &= m[w];
      if (w == W - 1 && (N & 63)) free &= (uint64_t{1} << (N & 63)) - 1;
      if (!free) continue;
      const size_t q = (w << 6) + static_cast<size_t>(__builtin_ctzll(free));
      col[i] = static_cast<int>(q);
      taken[w] |= uint64_t{1} << (q & 63);
      --left;
      return;
    }
  };
  // The rows not paired yet, in order (those paired at a cost leave the list).
  std::vector<size_t> open(N);
  std::iota(open.begin(), open.end(), size_t{0});
  for (size_t v = 0; v <= V && left > 0; ++v) {
    size_t kept = 0;
    for (const size_t i : open) {
      if (left > 0 && (v == V || ((has[i] >> (v & 63)) & 1))) take(i, v < V ? bits.data() + (i * V + v) * W : nullptr);
      if (col[i] < 0) open[kept++] = i;
    }
    open.resize(kept);
  }
  return col;
}

namespace {

// The node cost matrix of aligning `fresh` to `prev`, row by row: [physical node i][fresh node q],
// the replicas of fresh node q that physical node i lacks (multiset difference). The matrix is this
// thread's one buffer, valid until the next call: a fresh 4 MB matrix per layer at 1,024 nodes was zeroed
// twice (the kernel's new pages, then the vector's), 4% of a re-placement's CPU.
const std::vector<int>& node_costs(const std::vector<int>& prev, const std::vector<int>& fresh, const Cluster& cl,
                                   int experts) {
  const int N = cl.nodes, c = cl.slots_per_node();
  // Node cost: replicas of fresh node q that physical node i lacks (multiset difference), that is
  // c minus the replicas they share; shared counts gathered per expert over the fresh nodes holding
  // it, one physical node (one row of the matrix) at a time.
  std::vector<int> offset(static_cast<size_t>(experts) + 1, 0);  // expert -> its (fresh node, replicas) runs
  {
    std::vector<int> last(experts, -1);
    for (int q = 0; q < N; ++q)
      for (int s = 0; s < c; ++s) {
        const int e = fresh[static_cast<size_t>(q) * c + s];
        if (last[e] != q) last[e] = q, offset[e + 1]++;
      }
  }
  for (int e = 0; e < experts; ++e) offset[e + 1] += offset[e];
  std::vector<std::pair<int, int>> held(offset[experts]);
  {
    std::vector<int> fill(offset.begin(), offset.end() - 1);
    for (int q = 0; q < N; ++q)
      for (int s = 0; s < c; ++s) {
        const int e = fresh[static_cast<size_t>(q) * c + s];
        if (fill[e] > offset[e] && held[fill[e] - 1].first == q) held[fill[e] - 1].second++;
        else held[fill[e]++] = {q, 1};
      }
  }
  thread_local std::vector<int> cost;
  cost.resize(static_cast<size_t>(N) * N);  // [physical node i][fresh node q]; every row is filled below
  std::vector<int> have(experts, 0);
  for (int i = 0; i < N; ++i) {
    const int* node = prev.data() + static_cast<size_t>(i) * c;
    int* row = cost.data() + static_cast<size_t>(i) * N;
    std::fill(row, row + N, c);
    for (int s = 0; s < c; ++s) have[node[s]]++;
    for (int s = 0; s < c; ++s) {
      const int e = node[s];
      if (have[e] <= 0) continue;  // counted once per expert
      for (int k = offset[e]; k < offset[e + 1]; ++k) row[held[k].first] -= std::min(have[e], held[k].second);
      have[e] = 0;
    }
  }
  return cost;
}

// No alignment of `fresh` to `prev` needs fewer GPU-level copies than this: the copies of a GPU pair
// are at least the node-level copies of their nodes (a GPU matches only what its node matches), and
// every node pairing costs at least the sum of the rows' least costs, and of the columns'. Within a
// few percent of align_to's copies (at 1,024 nodes: 94%), for the cost of one pass over the matrix.
long long alignment_lower_bound(const std::vector<int>& cost, int N) {
  long long rows = 0, cols = 0;
  std::vector<int> col_min(static_cast<size_t>(N), std::numeric_limits<int>::max());
  for (int i = 0; i < N; ++i) {
    const int* row = cost.data() + static_cast<size_t>(i) * N;
    int m = std::numeric_limits<int>::max();
    for (int q = 0; q < N; ++q) {
      m = std::min(m, row[q]);
      col_min[q] = std::min(col_min[q], row[q]);
    }
    rows += m;
  }
  for (int v : col_min) cols += v;
  return std::max(rows, cols);
}

}  // namespace

long long alignment_copies_lower_bound(const std::vector<int>& before, const std::vector<int>& after,
                                       const Cluster& cluster, int experts) {
  return alignment_lower_bound(node_costs(before, after, cluster, experts), cluster.nodes);
}

namespace {

// `fresh` with its nodes, and the GPUs inside each node, permuted (both optimal assignments; the
// nodes greedily above kExactAlignmentNodes) so that it needs the fewest GPU-level copies from `prev`
// that node and GPU relabelings allow; `cost` is node_costs(prev, fresh). Balance, fault tolerance
// and recovery of a layer do not depend on the labels.
std::vector<int> align_with(const std::vector<int>& cost, const std::vector<int>& prev, const std::vector<int>& fresh,
                            const Cluster& cl) {
  const int N = cl.nodes, G = cl.gpus_per_node, S = cl.slots_per_gpu, c = cl.slots_per_node();
  std::vector<int> node_of;
  if (N <= kExactAlignmentNodes) {
    std::vector<std::vector<long long>> square(N, std::vector<long long>(N));
    for (int i = 0; i < N; ++i)
      for (int q = 0; q < N; ++q) square[i][q] = cost[static_cast<size_t>(i) * N + q];
    node_of = min_cost_assignment(square);
  } else {
    node_of = greedy_assignment(cost, N, c);
  }
  std::vector<int> out(cl.slots());
  std::vector<std::vector<long long>> gc(G, std::vector<long long>(G));
  for (int i = 0; i < N; ++i) {
    const int q = node_of[i];
    for (int g = 0; g < G; ++g)
      for (int h = 0; h < G; ++h)
        gc[g][h] = S - matched_slots(prev.data() + static_cast<size_t>(i * G + g) * S,
                                     fresh.data() + static_cast<size_t>(q * G + h) * S, S);
    std::vector<int> gpu_of = min_cost_assignment(gc);
    for (int g = 0; g < G; ++g)
      for (int s = 0; s < S; ++s) out[(i * G + g) * S + s] = fresh[(q * G + gpu_of[g]) * S + s];
  }
  return out;
}

struct Trajectory {
  std::vector<LayerMove> moves;
  std::vector<double> max_after;  // layer maximum after each prefix (index 0: no move)
  std::vector<long long> copies;  // copies beyond the mandatory ones after each prefix
  size_t taken = 0;
  std::vector<int> fresh;  // the last point, when set: balanced-ft from scratch, aligned to the previous
  // The last point is balanced-ft from scratch but not aligned yet (`fresh` empty): its entry of
  // `copies` is alignment_lower_bound's, until take_best_extensions needs the exact count.
  bool fresh_pending = false;
  long long base_cost = 0;  // the base placement's copies (what `copies` counts beyond)
};

}  // namespace

long long copies_between(const std::vector<int>& before, const std::vector<int>& after, const Cluster& cl) {
  long long n = 0;
  for (int g = 0; g < cl.gpus(); ++g) n += gpu_copies(before, after, g, cl.slots_per_gpu);
  return n;
}

namespace {

// Per GPU, the rounds in which it receives as bits; the round capacity doubles when a round beyond it
// is marked, so a test is one load (the senders are kept round by round: GpusByRound).
class RoundBits {
 public:
  explicit RoundBits(int units) : units_(units), bits_(static_cast<size_t>(units) * words_, 0) {}
  bool test(int u, int r) const {
    const size_t w = static_cast<size_t>(r) >> 6;
    return w < words_ && ((bits_[static_cast<size_t>(u) * words_ + w] >> (r & 63)) & 1);
  }
  void set(int u, int r) {
    const size_t w = static_cast<size_t>(r) >> 6;
    if (w >= words_) grow(w + 1);
    bits_[static_cast<size_t>(u) * words_ + w] |= uint64_t{1} << (r & 63);
  }

 private:
  void grow(size_t need) {
    const size_t nw = std::max(need, 2 * words_);
    std::vector<uint64_t> nb(static_cast<size_t>(units_) * nw, 0);
    for (int u = 0; u < units_; ++u)
      std::copy_n(bits_.begin() + static_cast<std::ptrdiff_t>(u * words_), words_,
                  nb.begin() + static_cast<std::ptrdiff_t>(u * nw));
    bits_.swap(nb);
    words_ = nw;
  }
  int units_;
  size_t words_ = 4;
  std::vector<uint64_t> bits_;
};

// The GPUs busy in each round as bits, round by round: the test of every holder of an expert in
// one round (HolderRounds::best, building a row) reads one row of D bits (1 KB at 8,192 GPUs, in
// the cache) instead of a word per GPU from RoundBits' rows (a cache miss each; that loop was a
// third of schedule_transfers at 1,024 nodes).
class GpusByRound {
 public:
  explicit GpusByRound(int units) : words_((static_cast<size_t>(units) + 63) >> 6) {}
  bool test(int u, int r) const {
    const size_t at = static_cast<size_t>(r) * words_ + (static_cast<size_t>(u) >> 6);
    return at < bits_.size() && ((bits_[at] >> (u & 63)) & 1);
  }
  void set(int u, int r) {
    const size_t row = static_cast<size_t>(r) * words_;
    if (row + words_ > bits_.size()) bits_.resize(row + words_, 0);
    bits_[row + (static_cast<size_t>(u) >> 6)] |= uint64_t{1} << (u & 63);
  }

 private:
  size_t words_;
  std::vector<uint64_t> bits_;  // [round * words_ + gpu / 64]
};

// The holders of each expert of one layer (GPU order, CSR) with their sends so far side by side, and
// for the (expert, round) pairs asked about, which of its holders send in that round, as bits by
// holder position (made by testing each holder once, then kept current as holders send). The free
// holder with the fewest sends, the first of them in GPU order, is then found among the clear bits
// only.
// (expert, round) -> an offset, for one layer: a dense table experts x rounds while that stays
// within 4 M entries, 32 MB (the rounds it covers double when a later round comes), else a hash map.
class PairIndex {
 public:
  static constexpr size_t kNone = SIZE_MAX;
  void reset(size_t experts) {
    if (overflow_ || experts != experts_) {
      overflow_ = false;
      experts_ = experts;
      rounds_ = 0;
      table_.clear();
      map_.clear();
    } else {
      for (uint64_t k : keys_) table_[(k >> 32) * rounds_ + (k & 0xffffffffu)] = kNone;
    }
    keys_.clear();
  }
  size_t find(int e, int r) const {
    if (overflow_) {
      auto it = map_.find(key(e, r));
      return it == map_.end() ? kNone : it->second;
    }
    const size_t re = static_cast<size_t>(r);
    return re < rounds_ ? table_[static_cast<size_t>(e) * rounds_ + re] : kNone;
  }
  void insert(int e, int r, size_t value) {
    const size_t re = static_cast<size_t>(r);
    if (!overflow_ && re >= rounds_) grow(re + 1);
    keys_.push_back(key(e, r));
    if (overflow_) map_[key(e, r)] = value;
    else table_[static_cast<size_t>(e) * rounds_ + re] = value;
  }

 private:
  static uint64_t key(int e, int r) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(e)) << 32) | static_cast<uint32_t>(r);
  }
  void grow(size_t need) {
    const size_t rounds = std::max<size_t>({need, 2 * rounds_, 64});
    if (experts_ * rounds > (size_t{1} << 22)) {  // too large: the hash map from here on (this layer)
      for (uint64_t k : keys_) map_[k] = table_[(k >> 32) * rounds_ + (k & 0xffffffffu)];
      table_.clear();
      rounds_ = 0;
      overflow_ = true;
      return;
    }
    std::vector<size_t> t(experts_ * rounds, kNone);
    for (size_t e = 0; e < experts_ && rounds_; ++e)
      std::copy_n(table_.begin() + static_cast<std::ptrdiff_t>(e * rounds_), rounds_,
                  t.begin() + static_cast<std::ptrdiff_t>(e * rounds));
    table_.swap(t);
    rounds_ = rounds;
  }
  size_t experts_ = 0, rounds_ = 0;
  bool overflow_ = false;
  std::vector<size_t> table_;   // [expert * rounds_ + round]
  std::vector<uint64_t> keys_;  // inserted this layer
  std::unordered_map<uint64_t, size_t> map_;
};

class HolderRounds {
 public:
  explicit HolderRounds(size_t max_level_words) : max_level_words_(max_level_words) {}
  void build(const std::vector<int>& offset, const std::vector<int>& hold, const std::vector<long long>& sent) {
    offset_ = &offset;
    hold_ = &hold;
    sends_.resize(hold.size());
    for (size_t k = 0; k < hold.size(); ++k) sends_[k] = sent[static_cast<size_t>(hold[k])];
    made_.reset(offset.size() - 1);
    bits_.clear();
    // Per expert its holders by sends: a row of bits per send count from the fewest (levels).
    const size_t E = offset.size() - 1;
    base_.assign(E, 0);
    low_.assign(E, 0);
    top_.assign(E, 0);
    cap_.assign(E, 0);
    at_.assign(E, 0);
    word_at_.assign(E, 0);
    levels_.clear();
    counts_.clear();
    use_levels_ = true;
    size_t need = 0;
    for (size_t e = 0; e < E; ++e) {
      const size_t b = static_cast<size_t>(offset[e]), m = static_cast<size_t>(offset[e + 1]) - b;
      if (!m) continue;
      long long lo = sends_[b], hi = sends_[b];
      for (size_t k = b; k < b + m; ++k) lo = std::min(lo, sends_[k]), hi = std::max(hi, sends_[k]);
      base_[e] = lo;
      top_[e] = static_cast<size_t>(hi - lo);
      cap_[e] = top_[e] + 4;
      need += cap_[e] * words(e);
    }
    if (need > max_level_words_) {
      use_levels_ = false;
      return;
    }
    for (size_t e = 0; e < E; ++e) {
      at_[e] = counts_.size();
      word_at_[e] = levels_.size();
      levels_.resize(levels_.size() + cap_[e] * words(e), 0);
      counts_.resize(counts_.size() + cap_[e], 0);
      const size_t b = static_cast<size_t>(offset[e]), m = static_cast<size_t>(offset[e + 1]) - b;
      for (size_t k = 0; k < m; ++k) {
        const size_t level = static_cast<size_t>(sends_[b + k] - base_[e]);
        level_row(e, level)[k >> 6] |= uint64_t{1} << (k & 63);
        counts_[at_[e] + level]++;
      }
    }
  }
  // Holder at index `at` of hold (an expert's offset + its position) sent once more, in round r.
  void sent(int e, int at, int r) {
    const size_t k = static_cast<size_t>(at - (*offset_)[e]);
    if (use_levels_) {
      const size_t x = static_cast<size_t>(e), level = static_cast<size_t>(sends_[static_cast<size_t>(at)] - base_[x]);
      if (level + 1 >= cap_[x]) grow(x);
    }
    if (use_levels_) {
      const size_t x = static_cast<size_t>(e), level = static_cast<size_t>(sends_[static_cast<size_t>(at)] - base_[x]);
      level_row(x, level)[k >> 6] &= ~(uint64_t{1} << (k & 63));
      level_row(x, level + 1)[k >> 6] |= uint64_t{1} << (k & 63);
      counts_[at_[x] + level]--;
      counts_[at_[x] + level + 1]++;
      top_[x] = std::max(top_[x], level + 1);
      while (counts_[at_[x] + low_[x]] == 0) low_[x]++;
    }
    sends_[static_cast<size_t>(at)]++;
    const size_t row = made_.find(e, r);
    if (row != PairIndex::kNone) bits_[row + (k >> 6)] |= uint64_t{1} << (k & 63);
  }
  // The free holder of e in round r with the fewest sends, the first of them in GPU order, leaving
  // out position `skip` (-1: none); -1 when none is free. `busy(h)` tests a GPU in round r.
  template <class Busy>
  int best(int e, int r, int skip, Busy&& busy) {
    const size_t b = static_cast<size_t>((*offset_)[e]), m = static_cast<size_t>((*offset_)[e + 1]) - b;
    const size_t words = (m + 63) >> 6;
    // A row is its `words` words of busy bits, then a bit per word: made yet. A word is made (every
    // holder of its 64 tested once) only when the search reads it: the search stops at the first
    // free holder of the fewest sends, mostly in the first words (an expert held by thousands of
    // GPUs had all of them tested for every round asked about). sent() sets bits in words made or
    // not: making a word later tests busy(), which has that send too.
    size_t at = made_.find(e, r);
    if (at == PairIndex::kNone) {
      at = bits_.size();
      made_.insert(e, r, at);
      bits_.resize(bits_.size() + words + ((words + 63) >> 6), 0);
    }
    uint64_t* row = bits_.data() + at;
    uint64_t* made = row + words;
    auto word = [&](size_t w) {
      if (!((made[w >> 6] >> (w & 63)) & 1)) {
        uint64_t bits = 0;
        for (size_t k = w << 6, end = std::min(m, (w + 1) << 6); k < end; ++k)
          if (busy((*hold_)[b + k])) bits |= uint64_t{1} << (k & 63);
        row[w] |= bits;
        made[w >> 6] |= uint64_t{1} << (w & 63);
      }
      return row[w];
    };
    auto free_bits = [&](size_t w, uint64_t candidates) {
      if (!candidates) return uint64_t{0};
      uint64_t free = candidates & ~word(w);
      if (w == words - 1 && (m & 63)) free &= (uint64_t{1} << (m & 63)) - 1;
      if (skip >= 0 && static_cast<size_t>(skip) >> 6 == w) free &= ~(uint64_t{1} << (skip & 63));
      return free;
    };
    if (use_levels_) {
      // Send count by send count from the fewest: the first free holder there, in GPU order.
      const size_t x = static_cast<size_t>(e);
      for (size_t level = low_[x]; level <= top_[x]; ++level) {
        if (!counts_[at_[x] + level]) continue;
        const uint64_t* held = level_row(x, level);
        for (size_t w = 0; w < words; ++w)
          if (const uint64_t free = free_bits(w, held[w]))
            return (*hold_)[b + (w << 6) + static_cast<size_t>(__builtin_ctzll(free))];
      }
      return -1;
    }
    long long least = 0;
    int from = -1;
    for (size_t w = 0; w < words; ++w) {
      uint64_t free = free_bits(w, ~uint64_t{0});
      while (free) {
        const size_t k = (w << 6) + static_cast<size_t>(__builtin_ctzll(free));
        free &= free - 1;
        if (from < 0 || sends_[b + k] < least) from = static_cast<int>(k), least = sends_[b + k];
      }
    }
    return from < 0 ? -1 : (*hold_)[b + static_cast<size_t>(from)];
  }

 private:
  size_t words(size_t e) const { return (static_cast<size_t>((*offset_)[e + 1] - (*offset_)[e]) + 63) >> 6; }
  uint64_t* level_row(size_t e, size_t level) { return levels_.data() + (at_words(e) + level * words(e)); }
  // The levels of e start at at_[e] in counts_ and at the matching word in levels_: both pools grow
  // together, an expert's block moved to their end (twice the levels) when it needs more.
  size_t at_words(size_t e) const { return word_at_[e]; }
  void grow(size_t e) {
    const size_t w = words(e), cap = cap_[e] * 2;
    if (levels_.size() + cap * w > max_level_words_) {
      use_levels_ = false;  // the scan of the clear bits from here on (sends_ is kept either way)
      return;
    }
    const size_t from_words = word_at_[e], from_counts = at_[e];
    const size_t to_words = levels_.size(), to_counts = counts_.size();
    levels_.resize(to_words + cap * w, 0);
    counts_.resize(to_counts + cap, 0);
    std::copy_n(levels_.begin() + static_cast<std::ptrdiff_t>(from_words), cap_[e] * w,
                levels_.begin() + static_cast<std::ptrdiff_t>(to_words));
    std::copy_n(counts_.begin() + static_cast<std::ptrdiff_t>(from_counts), cap_[e],
                counts_.begin() + static_cast<std::ptrdiff_t>(to_counts));
    word_at_[e] = to_words;
    at_[e] = to_counts;
    cap_[e] = cap;
  }
  const std::vector<int>* offset_ = nullptr;
  const std::vector<int>* hold_ = nullptr;
  size_t max_level_words_;
  std::vector<long long> sends_;  // per holder (index in hold): sends of its GPU so far
  PairIndex made_;                // (expert, round) -> its bits in bits_
  std::vector<uint64_t> bits_;
  bool use_levels_ = true;
  std::vector<long long> base_;                         // per expert: the fewest sends among its holders at the start
  std::vector<size_t> low_, top_, cap_, at_, word_at_;  // lowest and highest level in use, levels made, where
  std::vector<uint64_t> levels_;                        // per expert and level: its holders with base + level sends
  std::vector<int> counts_;                             // per expert and level: how many
};

}  // namespace

void schedule_transfers(const std::vector<std::vector<int>>& before, ReplaceResult& res, const Cluster& cl,
                        size_t max_level_words) {
  const int D = cl.gpus(), S = cl.slots_per_gpu;
  GpusByRound sends(D);
  RoundBits recvs(D);
  std::vector<long long> sent(D, 0);
  res.transfers.clear();
  if (res.copies > 0) res.transfers.reserve(static_cast<size_t>(res.copies));  // one transfer a copy
  res.rounds = 0;
  res.round_lower_bound = 0;
  std::vector<int> received(D, 0);
  std::vector<int> first_free(D, 0);  // every round before it receives already
  std::vector<char> used(S);
  std::vector<int> offset, hold;  // holders of each expert in the previous placement, GPU order (CSR)
  // Per GPU, the experts it holds in the previous placement and its index in their holders.
  std::vector<std::pair<int, int>> mine(static_cast<size_t>(D) * S);
  std::vector<int> nmine(D);
  HolderRounds holders(max_level_words);
  auto next_free_recv = [&](int g) {
    while (recvs.test(g, first_free[g])) ++first_free[g];
  };
  for (size_t l = 0; l < res.layers.size(); ++l) {
    const auto& old = before[l];
    const auto& now = res.layers[l].phy2log;
    const int E = *std::max_element(old.begin(), old.end()) + 1;
    offset.assign(static_cast<size_t>(E) + 1, 0);
    std::vector<int> last(E, -1);
    for (int p = 0; p < cl.slots(); ++p) {
      const int g = cl.gpu_of_slot(p), e = old[p];
      if (last[e] != g) last[e] = g, offset[e + 1]++;
    }
    for (int e = 0; e < E; ++e) offset[e + 1] += offset[e];
    hold.assign(offset[E], 0);
    std::vector<int> fill(offset.begin(), offset.end() - 1);
    std::fill(last.begin(), last.end(), -1);
    std::fill(nmine.begin(), nmine.end(), 0);
    for (int p = 0; p < cl.slots(); ++p) {
      const int g = cl.gpu_of_slot(p), e = old[p];
      if (last[e] == g) continue;
      last[e] = g;
      mine[static_cast<size_t>(g) * S + nmine[g]++] = {e, fill[e]};
      hold[fill[e]++] = g;
    }
    holders.build(offset, hold, sent);
    for (int g = 0; g < D; ++g) {
      std::fill(used.begin(), used.end(), 0);
      for (int a = 0; a < S; ++a) {
        int e = now[g * S + a];
        bool have = false;
        for (int b = 0; b < S && !have; ++b)
          if (!used[b] && old[g * S + b] == e) used[b] = 1, have = true;
        if (have) continue;
        ++received[g];
        if (e >= E || offset[e] == offset[e + 1]) {  // lost: from a checkpoint
          const int r = first_free[g];
          recvs.set(g, r);
          next_free_recv(g);
          res.transfers.push_back({static_cast<int>(l), e, -1, g, r});
          res.rounds = std::max(res.rounds, r + 1);
          continue;
        }
        // The only holder may be g itself (a second copy of an expert it keeps): a copy inside the GPU,
        // scheduled like a transfer from g to g.
        const bool local = offset[e + 1] - offset[e] == 1 && hold[offset[e]] == g;
        int skip = -1;  // g's position among the holders of e, when it holds e and may not send it
        if (!local)
          for (int j = 0; j < nmine[g]; ++j)
            if (mine[static_cast<size_t>(g) * S + j].first == e)
              skip = mine[static_cast<size_t>(g) * S + j].second - offset[e];
        for (int r = first_free[g];; ++r) {
          if (recvs.test(g, r)) continue;
          // The free holder with the fewest sends so far, the first of them in GPU order.
          const int from = holders.best(e, r, skip, [&](int h) { return sends.test(h, r); });
          if (from < 0) continue;
          sends.set(from, r);
          recvs.set(g, r);
          sent[from]++;
          for (int j = 0; j < nmine[from]; ++j) {
            const auto& [x, at] = mine[static_cast<size_t>(from) * S + j];
            holders.sent(x, at, r);
          }
          next_free_recv(g);
          res.transfers.push_back({static_cast<int>(l), e, from, g, r});
          res.rounds = std::max(res.rounds, r + 1);
          break;
        }
      }
    }
  }
  res.round_lower_bound = D ? *std::max_element(received.begin(), received.end()) : 0;
}

namespace {

// What a layer's placement costs against the previous one: GPU-level copies (--previous), or with
// `node_fetches` the (node, expert) pairs a node did not hold (node loss: a copy between GPUs of one
// node does not cross the network, and the node-level count is what migrate reports). `touched` is
// the cost of the units a move changes, so a move's cost is touched after minus touched before.
class CopyCost {
 public:
  CopyCost(const std::vector<int>& prev, const Cluster& cl, int experts, bool node_fetches)
      : prev_(prev), cl_(cl), experts_(experts), nodes_(node_fetches) {
    if (!nodes_) return;
    held_.assign(static_cast<size_t>(experts) * cl.nodes, 0);
    for (int p = 0; p < cl.slots(); ++p) held_[static_cast<size_t>(prev[p]) * cl.nodes + cl.node_of_slot(p)] = 1;
  }
  long long full(const std::vector<int>& now) const {
    if (!nodes_) return copies_between(prev_, now, cl_);
    long long n = 0;
    std::vector<int> seen(experts_, -1);
    for (int p = 0; p < cl_.slots(); ++p) {
      const int e = now[p], node = cl_.node_of_slot(p);
      if (seen[e] == node) continue;
      seen[e] = node;
      n += held_[static_cast<size_t>(e) * cl_.nodes + node] ? 0 : 1;
    }
    return n;
  }
  long long touched(const LayerState& st, const LayerMove& m) const {
    const int gp = cl_.gpu_of_slot(m.p), gq = m.rewrite ? gp : cl_.gpu_of_slot(m.q);
    if (!nodes_) {
      long long n = gpu_copies(prev_, st.phy2log(), gp, cl_.slots_per_gpu);
      return gq == gp ? n : n + gpu_copies(prev_, st.phy2log(), gq, cl_.slots_per_gpu);
    }
    const int x = st.phy2log()[m.p], y = m.rewrite ? m.q : st.phy2log()[m.q];
    const int a = cl_.node_of_gpu(gp), b = cl_.node_of_gpu(gq);
    const int es[2] = {x, y}, ns[2] = {a, b};
    long long n = 0;
    for (int i = 0; i < (x == y ? 1 : 2); ++i)
      for (int j = 0; j < (a == b ? 1 : 2); ++j)
        n += st.on_node(es[i], ns[j]) > 0 && !held_[static_cast<size_t>(es[i]) * cl_.nodes + ns[j]] ? 1 : 0;
    return n;
  }

 private:
  const std::vector<int>& prev_;
  const Cluster& cl_;
  int experts_;
  bool nodes_;
  std::vector<char> held_;  // [expert][node]: the node held the expert before
};

// One layer's options: the previous placement after the mandatory copies (f replicas on f nodes),
// then the balance moves one by one with the cost each prefix adds, and last, when `fresh_for`
// gives one for the moves made (true: the search stalled before `limit`), `fresh` (balanced-ft from
// scratch) aligned to the previous placement. Adds the mandatory copies to `mandatory` (their cost to
// `mandatory_cost`) and returns the base placement in `base`.
Trajectory layer_trajectory(const std::vector<int>& prev, const std::vector<double>& t, const Cluster& cl, int f,
                            int experts, const std::function<const LayerPlacement*(bool)>& fresh_for, bool node_fetches,
                            int limit, bool every_gain, long long& mandatory, long long& mandatory_cost,
                            std::vector<int>& base) {
  LayerState run(cl, t, prev);
  raise_counts(run, f);
  repair_fault_tolerance(run, f);
  mandatory += copies_between(prev, run.phy2log(), cl);
  const CopyCost cost(prev, cl, experts, node_fetches);
  const long long base_cost = cost.full(run.phy2log());
  mandatory_cost += base_cost;
  base = run.phy2log();
  Trajectory tr;
  long long cur = base_cost;
  tr.max_after.push_back(run.max_load());
  tr.copies.push_back(0);
  for (int i = 0; i < limit; ++i) {
    std::optional<LayerMove> m = best_swap(run, f);
    if (!m) m = best_rewrite(run, f);
    if (!m) break;
    cur -= cost.touched(run, *m);
    apply_move(run, *m);
    cur += cost.touched(run, *m);
    tr.moves.push_back(*m);
    tr.max_after.push_back(run.max_load());
    tr.copies.push_back(cur - base_cost);
  }
  tr.base_cost = base_cost;
  if (const LayerPlacement* fresh = fresh_for(static_cast<int>(tr.moves.size()) < limit)) {
    // Aligning permutes whole GPUs, slots kept in order: the same GPU loads, bit for bit.
    const auto g = gpu_loads(fresh->phy2log, t, cl);
    tr.max_after.push_back(*std::max_element(g.begin(), g.end()));
    const std::vector<int>& nc = node_costs(prev, fresh->phy2log, cl, experts);
    // With `every_gain` (weight 0, no budget: every batch that lowers the maximum is taken), a
    // from-scratch point below every other point is taken whatever its copies: aligned now, with the
    // node costs at hand.
    const bool taken_anyway = every_gain &&
                              tr.max_after.back() < *std::min_element(tr.max_after.begin(), tr.max_after.end() - 1);
    if (node_fetches) {  // the bound counts replicas, not the experts a node fetches
      tr.fresh = align_with(nc, prev, fresh->phy2log, cl);
      tr.copies.push_back(cost.full(tr.fresh) - base_cost);
    } else if (taken_anyway) {
      tr.fresh = align_with(nc, prev, fresh->phy2log, cl);
      tr.copies.push_back(copies_between(prev, tr.fresh, cl) - base_cost);
    } else {
      tr.copies.push_back(alignment_lower_bound(nc, cl.nodes) - base_cost);
      tr.fresh_pending = true;
    }
  }
  return tr;
}

// Aligns a trajectory's pending from-scratch point and sets its exact copies.
void align_fresh(Trajectory& tr, const std::vector<int>& prev, const std::vector<int>& fresh, const Cluster& cl,
                 int experts) {
  tr.fresh = align_with(node_costs(prev, fresh, cl, experts), prev, fresh, cl);
  tr.copies.back() = copies_between(prev, tr.fresh, cl) - tr.base_cost;
  tr.fresh_pending = false;
}

// How far along each layer's trajectory to go: batches across layers, best balance gain per copy
// first (lazy priority queue), within `budget` copies and above the migration weight's threshold. A
// pending from-scratch point (Trajectory::fresh_pending) is aligned by `align` only when, with its
// lower bound for copies, it would be the layer's best extension: with its exact copies (no fewer)
// its ratio is no higher and it meets the budget and the threshold no more often, so wherever the
// bound does not make it the best, neither would the exact count, and every choice is the one the
// exact counts give.
void take_best_extensions(std::vector<Trajectory>& traj, double budget, double sum_mean, double migration_weight,
                          double all_replicas, const std::function<void(size_t)>& align) {
  long long spent = 0;
  struct Ext {
    double ratio;
    size_t layer, to;
    bool operator<(const Ext& o) const { return ratio < o.ratio; }
  };
  auto best_ext = [&](size_t l) -> std::optional<Ext> {
    const Trajectory& tr = traj[l];
    for (;;) {
      std::optional<Ext> best;
      for (size_t j = tr.taken + 1; j < tr.max_after.size(); ++j) {
        double gain = tr.max_after[tr.taken] - tr.max_after[j];
        long long cost = tr.copies[j] - tr.copies[tr.taken];
        if (gain <= 0) continue;
        if (static_cast<double>(spent + cost) > budget) continue;
        if (gain / sum_mean < migration_weight * static_cast<double>(cost) / all_replicas) continue;
        double ratio = cost <= 0 ? INFINITY : gain / static_cast<double>(cost);
        if (!best || ratio > best->ratio) best = Ext{ratio, l, j};
      }
      if (!(best && tr.fresh_pending && best->to == tr.max_after.size() - 1)) return best;
      align(l);  // then again with its exact copies
    }
  };
  std::priority_queue<Ext> pq;
  for (size_t l = 0; l < traj.size(); ++l)
    if (auto e = best_ext(l)) pq.push(*e);
  while (!pq.empty()) {
    Ext e = pq.top();
    pq.pop();
    auto fresh = best_ext(e.layer);  // the budget may have shrunk since it was queued
    if (!fresh) continue;
    if (fresh->to != e.to || fresh->ratio != e.ratio) {
      pq.push(*fresh);
      continue;
    }
    Trajectory& tr = traj[e.layer];
    spent += tr.copies[e.to] - tr.copies[tr.taken];
    tr.taken = e.to;
    if (auto next = best_ext(e.layer)) pq.push(*next);
  }
}

// The placement of layer `l` at the point of its trajectory that was taken.
LayerPlacement taken_placement(const Trajectory& tr, std::vector<int>&& base, const LoadMatrix& loads,
                               int& from_scratch) {
  LayerPlacement lp;
  if ((!tr.fresh.empty() || tr.fresh_pending) && tr.taken == tr.max_after.size() - 1) {
    if (tr.fresh_pending) throw Error("internal: a from-scratch point taken without its alignment");
    lp.phy2log = tr.fresh;
    from_scratch++;
  } else if (tr.taken == 0) {
    lp.phy2log = std::move(base);
  } else {
    // The moves' effect on the slots alone (what LayerState's swap_slots and set_slot do to phy2log):
    // the trajectory kept the loads and the GPU order already, a second LayerState redid all of that.
    lp.phy2log = std::move(base);
    for (size_t i = 0; i < tr.taken; ++i) {
      const LayerMove& m = tr.moves[i];
      if (m.rewrite) lp.phy2log[static_cast<size_t>(m.p)] = m.q;
      else std::swap(lp.phy2log[static_cast<size_t>(m.p)], lp.phy2log[static_cast<size_t>(m.q)]);
    }
  }
  lp.phyrank = ranks_by_appearance(lp.phy2log, static_cast<int>(loads.experts));
  return lp;
}

}  // namespace

ReplaceResult replace_with_migration(const std::vector<std::vector<int>>& previous, const LoadMatrix& loads,
                                     const Cluster& cl, const ReplaceOptions& opt) {
  if (previous.size() != loads.layers)
    throw Error("previous plan has " + std::to_string(previous.size()) + " layers, loads have " +
                std::to_string(loads.layers));
  const int f = opt.fault_tolerance;
  const size_t L = loads.layers;
  const int experts = static_cast<int>(loads.experts);
  ReplaceResult res;
  std::vector<std::vector<int>> base(L);  // per layer: the previous placement after the mandatory copies
  std::vector<Trajectory> traj(L);
  // balanced-ft from scratch for the new loads: the far end of every layer's options.
  std::vector<LayerPlacement> fresh_layers;
  // Above kExactAlignmentNodes nodes (the re-placements at 1,024 nodes in seconds):
  // * a node loss with a migration weight > 0 or a budget has no from-scratch option: it fetches
  //   about a third of all replicas (1,024 nodes, W = 0.5: 342,500 fetches against 18,000 taken)
  //   and was not taken in any layer of the runs measured; placing and aligning it was about 40% of
  //   the run. ReplaceResult::from_scratch stays empty (the plan reports no from-scratch comparison).
  // * with weight 0 and no budget, where every batch that lowers a maximum is taken and so the
  //   layer ends at the lowest maximum of its points, the local search stops after 256 moves (the
  //   limit of clusters up to 512 GPUs) instead of GPUs / 2: balanced-ft from scratch is then one of
  //   the points and is lower than 4,096 moves reach in every layer measured at 1,024 nodes.
  const bool large = cl.nodes > kExactAlignmentNodes;
  const bool weighed = opt.migration_weight > 0 || opt.max_moved_bytes >= 0;
  const bool with_fresh = !(large && opt.count_node_fetches && weighed);
  const int limit = large && !weighed ? 256 : std::max(256, cl.gpus() / 2);
  const bool every_gain = opt.migration_weight == 0 && opt.max_moved_bytes < 0;
  // * with a migration weight or a budget (and no node loss), balanced-ft from scratch is placed only
  //   for a layer whose local search stalls before its limit: it moves 10,000-28,000 of the 32,768
  //   replicas of a layer at 1,024 nodes, where a search that runs to its limit is still lowering
  //   the maximum for a copy or two a move (at most 8,192 copies), and it was taken in none of those
  //   layers on the log-normal and heavy-tailed loads measured (where the search stalls it was taken
  //   in 6 of 13). Placing it for every layer was a fifth of the re-placement.
  const bool fresh_if_stalled = with_fresh && large && weighed;
  if (with_fresh && !fresh_if_stalled) {
    auto algo = make_algorithm("balanced-ft");
    PlacementOptions po;
    po.fault_tolerance = f;
    fresh_layers = algo->place(loads, cl, po).layers;
  } else if (fresh_if_stalled) {
    check_balanced_ft_request(loads, cl, f);  // before any layer, as balanced-ft's place() refuses
    fresh_layers.resize(L);
  }
  double sum_mean = 0;
  long long mandatory_cost = 0;  // the mandatory copies in the unit the budget counts
  for (size_t l = 0; l < L; ++l) {
    const auto& prev = previous[l];
    if (static_cast<int>(prev.size()) != cl.slots()) throw Error("previous plan: layer of the wrong size");
    std::vector<int> cnt = logical_counts(prev, experts);
    for (int e = 0; e < experts; ++e)
      if (cnt[e] == 0 && !opt.lost_allowed)
        throw Error("previous plan: layer " + std::to_string(l) + " has no replica of expert " + std::to_string(e));
    auto t = loads.layer_vector(l);
    sum_mean += std::accumulate(t.begin(), t.end(), 0.0) / cl.gpus();
    auto fresh_for = [&](bool stalled) -> const LayerPlacement* {
      if (fresh_layers.empty() || (fresh_if_stalled && !stalled)) return nullptr;
      if (fresh_if_stalled) fresh_layers[l] = balanced_ft_layer(t, cl, f);
      return &fresh_layers[l];
    };
    traj[l] = layer_trajectory(prev, t, cl, f, experts, fresh_for, opt.count_node_fetches, limit, every_gain,
                               res.mandatory_copies, mandatory_cost, base[l]);
  }

  const double all_replicas = static_cast<double>(L) * cl.slots();
  double budget = opt.max_moved_bytes < 0 ? INFINITY
                                          : (opt.expert_bytes > 0 ? opt.max_moved_bytes / opt.expert_bytes : 0.0);
  budget -= static_cast<double>(mandatory_cost);  // mandatory copies come first
  take_best_extensions(traj, budget, sum_mean, opt.migration_weight, all_replicas,
                       [&](size_t l) { align_fresh(traj[l], previous[l], fresh_layers[l].phy2log, cl, experts); });

  for (size_t l = 0; l < L; ++l) {
    LayerPlacement lp = taken_placement(traj[l], std::move(base[l]), loads, res.layers_from_scratch);
    long long c = copies_between(previous[l], lp.phy2log, cl);
    res.copies_per_layer.push_back(c);
    res.copies += c;
    res.layers.push_back(std::move(lp));
  }
  if (!fresh_if_stalled) res.from_scratch = std::move(fresh_layers);  // every layer's, or none
  schedule_transfers(previous, res, cl);
  return res;
}

nlohmann::json replace_to_json(const ReplaceResult& r, double expert_bytes) {
  nlohmann::json j = {{"copies_moved", r.copies},
                      {"mandatory_copies", r.mandatory_copies},
                      {"copies_moved_per_layer", r.copies_per_layer},
                      {"layers_from_scratch", r.layers_from_scratch},
                      {"rounds", r.rounds},
                      {"round_lower_bound", r.round_lower_bound},
                      {"transfers", kTransfersPlaceholder}};
  if (expert_bytes > 0) j["bytes_moved"] = expert_bytes * static_cast<double>(r.copies);
  return j;
}

void write_transfers_json(const ReplaceResult& r, const std::vector<int>* node_ids, int gpus_per_node,
                          const std::function<void(std::string_view)>& sink) {
  // Written with to_chars into one reused buffer: 1.5 million transfers at 1,024 nodes made ten
  // std::strings each (std::to_string and concatenation), about 5% of --previous.
  constexpr size_t kChunk = size_t{1} << 20;
  std::string out(kChunk + 512, '\0');
  char* const begin = out.data();
  char* at = begin;
  auto put = [&](std::string_view text) { at = std::copy(text.begin(), text.end(), at); };
  auto num = [&](int v) { at = std::to_chars(at, at + 16, v).ptr; };
  auto node = [&](int gpu) { return gpu < 0 ? -1 : (*node_ids)[gpu / gpus_per_node]; };
  *at++ = '[';
  for (size_t i = 0; i < r.transfers.size(); ++i) {
    const GpuTransfer& x = r.transfers[i];
    if (i) *at++ = ',';
    put("{\"expert\":");
    num(x.expert);
    put(",\"from_gpu\":");
    num(x.from);
    if (node_ids) put(",\"from_node\":"), num(node(x.from));
    put(",\"layer\":");
    num(x.layer);
    put(",\"round\":");
    num(x.round);
    put(",\"to_gpu\":");
    num(x.to);
    if (node_ids) put(",\"to_node\":"), num(node(x.to));
    *at++ = '}';
    if (static_cast<size_t>(at - begin) >= kChunk) {  // one transfer is at most about 160 characters
      sink(std::string_view(begin, static_cast<size_t>(at - begin)));
      at = begin;
    }
  }
  *at++ = ']';
  sink(std::string_view(begin, static_cast<size_t>(at - begin)));
}

std::string transfers_json_text(const ReplaceResult& r, const std::vector<int>* node_ids, int gpus_per_node) {
  std::string out;
  out.reserve(r.transfers.size() * (node_ids ? 90 : 64) + 2);
  write_transfers_json(r, node_ids, gpus_per_node, [&](std::string_view piece) { out.append(piece); });
  return out;
}

}  // namespace ucpkit::placement
