// Mutable layer placement and the local searches on it.
#include "placement/layer_state.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <span>
#include <type_traits>

#include "core/error.h"

namespace ucpkit::placement {

namespace {

// Cluster::gpu_of_slot as a shift where the slots per GPU are a power of two: the loops over every
// replica of an expert (tens of thousands for a dominant one at 1,024 nodes) spent much of their
// time in the division.
class SlotGpu {
 public:
  explicit SlotGpu(int slots_per_gpu)
      : S_(slots_per_gpu),
        shift_((slots_per_gpu & (slots_per_gpu - 1)) == 0 ? std::countr_zero(unsigned(slots_per_gpu)) : -1) {}
  int operator()(int slot) const { return shift_ >= 0 ? slot >> shift_ : slot / S_; }

 private:
  int S_, shift_;
};

// `start` plus `step` added `times` times, one addition at a time: the value a running sum over
// slots reaches (kept bit for bit, so that moves compare as they always did).
double add_times(double start, double step, int times) {
  for (int i = 0; i < times; ++i) start += step;
  return start;
}
double sub_times(double start, double step, int times) {
  for (int i = 0; i < times; ++i) start -= step;
  return start;
}

// add_times(0.0, step, times), or sub_times with `subtract`, from a table of the first few made once
// per step, the loop going on from its last entry past them: the same sums bit for bit.
class Multiples {
 public:
  Multiples() = default;
  explicit Multiples(double step, bool subtract = false) : step_(step), subtract_(subtract) {
    for (int i = 1; i < kTable; ++i) v_[i] = subtract ? v_[i - 1] - step : v_[i - 1] + step;
  }
  double operator()(int times) const {
    if (static_cast<unsigned>(times) < static_cast<unsigned>(kTable)) return v_[times];  // v_[0] is 0.0
    if (times < 0) return 0.0;
    const int more = times - (kTable - 1);
    return subtract_ ? sub_times(v_[kTable - 1], step_, more) : add_times(v_[kTable - 1], step_, more);
  }

 private:
  static constexpr int kTable = 8;
  double step_ = 0;
  bool subtract_ = false;
  double v_[kTable] = {};
};

// The GPUs holding expert x with their replica counts, and per GPU the load it reaches when every
// replica there changes by `step` (added `step` times), largest first. (value, index) pairs in
// descending order, sorted only as far as they are read: the searches walk the largest few and
// stop. The order read is that of sorting them all with std::greater (the pairs are distinct: the
// indexes are).
class Descending {
 public:
  using Item = std::pair<double, int>;
  void clear() { heap_.clear(), order_.clear(), stage_ = 0; }
  void push(const Item& x) { heap_.push_back(x); }
  void done() {}
  // The i-th largest, or nullptr past the end. The first read takes the kFirst largest with one
  // pass (most items are refused by one comparison with the least of them; a dominant expert has
  // thousands of holders, and building a heap of them all was a large part of the rewrite search);
  // the rest become a heap only if a search reads past them.
  const Item* at(size_t i) {
    if (i < order_.size()) return &order_[i];
    if (stage_ == 0) {
      stage_ = 1;
      const auto k = static_cast<std::ptrdiff_t>(std::min(heap_.size(), kFirst));
      std::partial_sort(heap_.begin(), heap_.begin() + k, heap_.end(), std::greater<>());
      order_.assign(heap_.begin(), heap_.begin() + k);
      if (i < order_.size()) return &order_[i];
    }
    if (stage_ == 1) {
      stage_ = 2;
      heap_.erase(heap_.begin(), heap_.begin() + static_cast<std::ptrdiff_t>(order_.size()));
      std::make_heap(heap_.begin(), heap_.end());
    }
    while (order_.size() <= i && !heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end());
      order_.push_back(heap_.back());
      heap_.pop_back();
    }
    return i < order_.size() ? &order_[i] : nullptr;
  }

 private:
  static constexpr size_t kFirst = 16;
  std::vector<Item> heap_, order_;
  int stage_ = 0;  // 0: unread; 1: the kFirst largest in order_ (still in heap_); 2: the rest a heap
};

struct Holders {
  std::span<const std::pair<int, int>> gpus;  // (gpu, replicas of x there), in LayerState::Scratch::held
  Descending by_value;                        // (load + changes, index into gpus), largest first
};

// An expert y of a light slot in one rewrite search: its holders (GPU, replicas of y), the load each
// holder of y gains per replica when y loses one (dy), and per slot of the most loaded GPU the two
// largest holder loads after the rewrite (made on first use).
struct YHolders {
  struct Top {
    bool made = false;
    double v1 = 0, v2 = 0;
    int k1 = -1, k2 = -1;
  };
  int y = -1;
  double dy = 0;
  Multiples dys;  // multiples of dy
  std::span<const std::pair<int, int>> gpus;
  std::vector<Top> top;
  // The three holders whose load plus their y changes (their value when they hold no x) is largest,
  // largest first (fewer when y has fewer holders): (value, index into gpus).
  std::pair<double, int> lead[3];
  int leads = 0;
};

// Version stamps unique across all states: a cache filled from one state (or a copy of it) can never
// match another state's different slots, whatever the copies and assignments in between.
unsigned long long next_stamp() {
  static std::atomic<unsigned long long> stamp{0};
  return ++stamp;
}

}  // namespace

// Scratch of best_swap and best_rewrite; the per-GPU arrays are all zero between calls.
struct LayerState::Scratch {
  std::vector<double> gshare, hshare;  // best_swap: shares on the most loaded GPU and on a light one
  std::vector<int> light_rewrite;      // the lightest GPUs, lightest first
  std::vector<double> sh;
  std::vector<int> hot, count, xcount;
  Holders xs, ys;
  std::vector<int> hot_on;  // replicas of an expert on every GPU: [row * D + gpu], rows kept between searches
  struct HotRow {
    int expert = -1;
    unsigned long long version = 0;  // the expert's version the row was filled at
    std::vector<int> gpus;           // the GPUs whose entry is set
  };
  std::vector<HotRow> hot_rows;
  std::vector<int> hot_row;  // per hot index: its row
  std::vector<char> row_used;
  std::vector<Holders> xh;
  std::vector<int> x_on;         // replicas of g's slot-sp expert on every GPU: [sp * D + gpu]
  std::vector<YHolders> ycache;  // light_gpu_slot_joins_hottest_gpu_expert: the experts y met so far
  // gather's result per expert, valid while held_version[e] == LayerState::version(e) (consecutive
  // searches look at mostly the same experts, and only the two a move involves change).
  std::vector<std::vector<std::pair<int, int>>> held;
  std::vector<unsigned long long> held_version;
};

LayerState::ScratchSlot::ScratchSlot() = default;
LayerState::ScratchSlot::ScratchSlot(const ScratchSlot&) {}
LayerState::ScratchSlot::ScratchSlot(ScratchSlot&&) noexcept = default;
LayerState::ScratchSlot& LayerState::ScratchSlot::operator=(const ScratchSlot&) { return *this; }
LayerState::ScratchSlot& LayerState::ScratchSlot::operator=(ScratchSlot&&) noexcept = default;
LayerState::ScratchSlot::~ScratchSlot() = default;

LayerState::Scratch& LayerState::scratch() const {
  if (!scratch_.p) scratch_.p = std::make_unique<Scratch>();
  return *scratch_.p;
}

LayerState::LayerState(const Cluster& cluster, std::vector<double> loads, std::vector<int> phy2log)
    : cluster_(cluster), experts_(static_cast<int>(loads.size())), t_(std::move(loads)), phy2log_(std::move(phy2log)) {
  if (static_cast<int>(phy2log_.size()) != cluster_.slots()) throw Error("internal: layer state of the wrong size");
  cnt_.assign(experts_, 0);
  distinct_.assign(experts_, 0);
  nodecnt_.assign(static_cast<size_t>(experts_) * cluster_.nodes, 0);
  slots_of_.assign(experts_, {});
  pos_.assign(cluster_.slots(), 0);
  version_.assign(experts_, next_stamp());
  for (int p = 0; p < cluster_.slots(); ++p) {
    int e = phy2log_[p];
    cnt_[e]++;
    pos_[p] = static_cast<int>(slots_of_[e].size());
    slots_of_[e].push_back(p);
    add_node(e, cluster_.node_of_slot(p), 1);
  }
  load_.assign(cluster_.gpus(), 0.0);
  share_.resize(experts_);
  for (int e = 0; e < experts_; ++e) share_[e] = cnt_[e] ? t_[e] / cnt_[e] : 0.0;
  for (int p = 0; p < cluster_.slots(); ++p) load_[cluster_.gpu_of_slot(p)] += share(phy2log_[p]);
  rest_at_.resize(load_.size());
  block_top_.resize((load_.size() + kBlock - 1) / kBlock);
  block_moved_.assign(block_top_.size(), 0);
  build_order();
}

void LayerState::build_order() {
  const size_t n = load_.size();
  std::vector<int> all(n);
  std::iota(all.begin(), all.end(), 0);
  auto by_load = [&](int a, int b) { return lighter(a, b); };
  const size_t k = std::min(n, kBottom);
  std::nth_element(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), all.end(), by_load);
  std::sort(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k), by_load);
  bottom_.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(k));
  rest_.clear();
  for (size_t i = k; i < n; ++i) rest_.push_back(entry(all[i]));
  for (int g : bottom_) rest_at_[g] = -1;
  for (size_t i = 0; i < rest_.size(); ++i) rest_at_[rest_[i].gpu] = static_cast<int>(i);
  for (size_t i = rest_.size() / 2; i-- > 0;) sift(rest_, rest_at_, i, false);
  for (size_t b = 0; b < block_top_.size(); ++b) scan_block(b);
  scan_top();
}

void LayerState::scan_block(size_t b) {
  const int first = static_cast<int>(b) * kBlock;
  const int last = std::min(first + kBlock, static_cast<int>(load_.size()));
  int m = first;
  for (int g = first + 1; g < last; ++g)
    if (load_[g] >= load_[m]) m = g;  // in id order: a tie goes to the larger id
  block_top_[b] = m;
}

void LayerState::scan_top() {
  int m = block_top_[0];
  for (size_t b = 1; b < block_top_.size(); ++b)
    if (load_[block_top_[b]] >= load_[m]) m = block_top_[b];  // blocks in id order
  top_ = m;
}

void LayerState::insert_bottom(int gpu) {
  auto at = std::upper_bound(bottom_.begin(), bottom_.end(), gpu, [&](int a, int b) { return lighter(a, b); });
  bottom_.insert(at, gpu);
  rest_at_[gpu] = -1;
}

void LayerState::sift(std::vector<Entry>& heap, std::vector<int>& at, size_t i, bool up) {
  // `first(a, b)`: a belongs above b.
  auto first = [](const Entry& a, const Entry& b) { return lighter(a, b); };
  const Entry g = heap[i];
  while (up && i > 0) {
    const size_t up = (i - 1) / 2;
    if (!first(g, heap[up])) break;
    heap[i] = heap[up];
    at[heap[i].gpu] = static_cast<int>(i);
    i = up;
  }
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= heap.size()) break;
    if (c + 1 < heap.size() && first(heap[c + 1], heap[c])) ++c;
    if (!first(heap[c], g)) break;
    heap[i] = heap[c];
    at[heap[i].gpu] = static_cast<int>(i);
    i = c;
  }
  heap[i] = g;
  at[g.gpu] = static_cast<int>(i);
}

void LayerState::settle_rest() {
  // A stale key is below its GPU's load: raising it only moves it down.
  while (!rest_.empty() && rest_[0].key != load_[rest_[0].gpu]) {
    rest_[0].key = load_[rest_[0].gpu];
    sift(rest_, rest_at_, 0, false);
  }
}

void LayerState::place(int gpu) {
  // The most loaded: gpu's block is scanned again when gpu was its top (its load may have fallen), and
  // all blocks' tops when gpu was the top of all.
  const size_t blk = static_cast<size_t>(gpu / kBlock);
  if (block_top_[blk] == gpu) {
    scan_block(blk);
    if (top_ == gpu) scan_top();
    else if (heavier(block_top_[blk], top_)) top_ = block_top_[blk];
  } else if (heavier(gpu, block_top_[blk])) {
    block_top_[blk] = gpu;
    if (heavier(gpu, top_)) top_ = gpu;
  }
  if (rest_at_[gpu] < 0) {  // among the lightest
    bottom_.erase(std::find(bottom_.begin(), bottom_.end(), gpu));
    settle_rest();
    if (!rest_.empty() && lighter(rest_[0], entry(gpu))) {
      // No longer: the lightest of the others (heavier than every one left) joins at the end, and
      // gpu takes its place in the heap.
      const int l = rest_[0].gpu;
      bottom_.push_back(l);
      rest_at_[l] = -1;
      rest_[0] = entry(gpu);
      rest_at_[gpu] = 0;
      sift(rest_, rest_at_, 0, false);
    } else {
      insert_bottom(gpu);
    }
  } else if (lighter(gpu, bottom_.back())) {
    // Now among the lightest: the heaviest of them (lighter than every other) takes its place in the heap.
    const int b = bottom_.back();
    bottom_.pop_back();
    const size_t i = static_cast<size_t>(rest_at_[gpu]);
    rest_[i] = entry(b);
    rest_at_[b] = static_cast<int>(i);
    sift(rest_, rest_at_, i, true);
    insert_bottom(gpu);
  } else {
    // The min-heap: a heavier GPU keeps its entry (a bound), a lighter one below it moves up.
    const size_t i = static_cast<size_t>(rest_at_[gpu]);
    if (load_[gpu] < rest_[i].key) {
      rest_[i].key = load_[gpu];
      sift(rest_, rest_at_, i, true);
    }
  }
}

LayerState::Lightest::Lightest(const LayerState& state) : st_(state) {}

int LayerState::Lightest::next() {
  if (taken_ < st_.bottom_.size()) return st_.bottom_[taken_++];
  // Past the lightest (no search walks that far: they stop at kBottom), the others sorted by
  // (load, GPU), the heap's entries being only bounds.
  if (taken_ == st_.bottom_.size() && rest_.empty()) {
    for (const Entry& e : st_.rest_) rest_.push_back(e.gpu);
    std::sort(rest_.begin(), rest_.end(), [&](int a, int b) { return st_.lighter(a, b); });
  }
  const size_t i = taken_ - st_.bottom_.size();
  if (i >= rest_.size()) return -1;
  ++taken_;
  return rest_[i];
}

void LayerState::lightest(size_t k, std::vector<int>& out) const {
  out.clear();
  Lightest it(*this);
  for (int g; out.size() < k && (g = it.next()) >= 0;) out.push_back(g);
}

void LayerState::add_load(int gpu, double delta) {
  load_[gpu] += delta;
  place(gpu);
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
  // Each slot keeps its place in its expert's list (as std::replace left it), found through pos_.
  const int i = pos_[p], j = pos_[q];
  slots_of_[x][static_cast<size_t>(i)] = q;
  slots_of_[y][static_cast<size_t>(j)] = p;
  pos_[q] = i;
  pos_[p] = j;
  version_[x] = version_[y] = next_stamp();
  phy2log_[p] = y;
  phy2log_[q] = x;
}

void LayerState::set_slot(int p, int e) {
  int x = phy2log_[p];
  if (x == e) return;
  // Many GPUs change load when x or e has many replicas: then their loads are updated first (the
  // same additions in the same order) and the order restored once.
  const bool batch = slots_of_[x].size() + slots_of_[e].size() > 8;
  auto add = [&](int gpu, double delta) {
    if (!batch) return add_load(gpu, delta);
    if (!moved_mark_[gpu]) {
      moved_mark_[gpu] = 1;
      moved_.push_back(gpu);
      pending_[gpu] = load_[gpu];
    }
    pending_[gpu] += delta;
  };
  if (batch) moved_mark_.resize(cluster_.gpus(), 0), pending_.resize(cluster_.gpus());
  const SlotGpu gpu_of(cluster_.slots_per_gpu);
  auto add_all = [&](int expert, double delta) {
    for (int s : slots_of_[expert]) add(gpu_of(s), delta);
  };
  add_all(x, -share(x));
  add_all(e, -share(e));
  auto& from = slots_of_[x];
  from.erase(from.begin() + pos_[p]);
  for (size_t i = static_cast<size_t>(pos_[p]); i < from.size(); ++i) pos_[from[i]] = static_cast<int>(i);
  pos_[p] = static_cast<int>(slots_of_[e].size());
  slots_of_[e].push_back(p);
  version_[x] = version_[e] = next_stamp();
  cnt_[x]--;
  cnt_[e]++;
  share_[x] = cnt_[x] ? t_[x] / cnt_[x] : 0.0;
  share_[e] = t_[e] / cnt_[e];
  add_node(x, cluster_.node_of_slot(p), -1);
  add_node(e, cluster_.node_of_slot(p), 1);
  phy2log_[p] = e;
  add_all(x, share(x));
  add_all(e, share(e));
  if (batch) reorder_moved();
}

void LayerState::reorder_moved() {
  // The new loads (the same additions in the same order, in pending_) take effect at once and the
  // order is restored without sorting all GPUs again: the blocks with a changed GPU are scanned
  // again for their most loaded, and only a GPU below its lazy bound moves in the min-heap (a
  // rewrite lowers the holders of the expert that gains a replica). Where few GPUs are past, each
  // moves up; where many are (from a quarter of the heap on), the heap is made again from its GPUs'
  // loads (in place, O(GPUs)). The lightest list is then sorted again and exchanges its heaviest
  // with the others' lightest while that one is lighter. The order is the one build_order gives
  // (the lightest list and the most loaded GPU are exact; the heap's layout is not observed).
  std::vector<int>& down = moved_down_;
  std::vector<int>& blocks = moved_blocks_;
  down.clear();
  blocks.clear();
  for (int g : moved_) {
    load_[g] = pending_[g];
    moved_mark_[g] = 0;
    if (rest_at_[g] >= 0 && load_[g] < rest_[static_cast<size_t>(rest_at_[g])].key) down.push_back(g);
    const size_t b = static_cast<size_t>(g / kBlock);
    if (!block_moved_[b]) block_moved_[b] = 1, blocks.push_back(static_cast<int>(b));
  }
  moved_.clear();
  for (int b : blocks) {
    block_moved_[static_cast<size_t>(b)] = 0;
    scan_block(static_cast<size_t>(b));
  }
  scan_top();
  if (down.size() * 4 > rest_.size()) {
    for (Entry& e : rest_) e.key = load_[e.gpu];
    for (size_t i = rest_.size() / 2; i-- > 0;) sift(rest_, rest_at_, i, false);
  } else {
    for (int g : down) {
      const size_t i = static_cast<size_t>(rest_at_[g]);
      rest_[i].key = load_[g];
      sift(rest_, rest_at_, i, true);
    }
  }
  // The lightest list: sorted again (insertion sort: few of its loads changed order), then the
  // others' lightest (exact once settled) takes the place of the list's heaviest while it is lighter.
  for (size_t i = 1; i < bottom_.size(); ++i)
    for (size_t j = i; j > 0 && lighter(bottom_[j], bottom_[j - 1]); --j) std::swap(bottom_[j], bottom_[j - 1]);
  for (;;) {
    settle_rest();
    if (rest_.empty() || bottom_.empty() || !lighter(rest_[0].gpu, bottom_.back())) break;
    const int l = rest_[0].gpu, b = bottom_.back();
    bottom_.pop_back();
    rest_[0] = entry(b);
    rest_at_[b] = 0;
    sift(rest_, rest_at_, 0, false);
    insert_bottom(l);
  }
}

namespace {

// The GPUs a swap partner is looked for on: all of them on small clusters, else the lightest 64.
std::vector<int> light_gpus(const LayerState& st, size_t limit) {
  std::vector<int> out;
  st.lightest(limit, out);
  return out;
}

bool keeps_guarantee(const LayerState& st, int f, int x, int from_node, int to_node) {
  return st.distinct_after_move(x, from_node, to_node) >= std::min(f, st.distinct(x));
}

}  // namespace

namespace {

// Whether some pair of shares (g of the most loaded GPU, h of a light one) has d = g - h > 0 and
// max(M - d, L + d) < best: the test best_swap makes of every pair, with the same arithmetic,
// without branches and two pairs at a time where a GPU has 4 slots.
bool any_improving_pair(const double* g, const double* h, int S, double M, double L, double best) {
  if (S == 4) {
    using V2 = double __attribute__((vector_size(16)));
    using M2 = long long __attribute__((vector_size(16)));
    const V2 g01 = {g[0], g[1]}, g23 = {g[2], g[3]}, Mv = {M, M}, Lv = {L, L}, Bv = {best, best}, zero = {0, 0};
    M2 acc = {0, 0};
    for (int q = 0; q < 4; ++q) {
      const V2 hv = {h[q], h[q]};
      for (const V2& gv : {g01, g23}) {
        const V2 d = gv - hv, a = Mv - d, b = Lv + d;
        acc |= (d > zero) & (a < Bv) & (b < Bv);  // max(a, b) < best: both are (loads are never NaN)
      }
    }
    return (acc[0] | acc[1]) != 0;
  }
  bool any = false;
  for (int sp = 0; sp < S; ++sp)
    for (int sq = 0; sq < S; ++sq) {
      const double d = g[sp] - h[sq];
      any |= (d > 0) & (std::max(M - d, L + d) < best);
    }
  return any;
}

}  // namespace

std::optional<LayerMove> best_swap(const LayerState& st, int f) {
  const Cluster& cl = st.cluster();
  const int S = cl.slots_per_gpu;
  int g = st.argmax_gpu();
  double M = st.load(g);
  double best = M - 1e-9 * std::max(1.0, M);
  std::optional<LayerMove> out;
  LayerState::Scratch& sc = st.scratch();
  std::vector<double>& gshare = sc.gshare;
  std::vector<double>& hshare = sc.hshare;
  gshare.resize(S);
  hshare.resize(S);
  double gmax = -std::numeric_limits<double>::infinity();
  for (int sp = 0; sp < S; ++sp) gmax = std::max(gmax, gshare[sp] = st.share(st.phy2log()[g * S + sp]));
  const int a = cl.node_of_gpu(g);
  LayerState::Lightest lightest(st);
  size_t seen = 0;
  for (int h; seen < 64 && (h = lightest.next()) >= 0; ++seen) {
    if (h == g) continue;
    const double L = st.load(h);
    // Any swap with h leaves max(M - d, L + d) >= (M + L) / 2 (up to rounding, far below the
    // margin), and the GPUs come lightest first: once that reaches the best found, no later GPU
    // improves on it.
    if ((M + L) * 0.5 * (1 - 1e-12) >= best) break;
    double hmin = std::numeric_limits<double>::infinity();
    for (int sq = 0; sq < S; ++sq) hmin = std::min(hmin, hshare[sq] = st.share(st.phy2log()[h * S + sq]));
    // No swap with h moves more than gmax - hmin off g (rounding is monotone, so neither does any
    // computed d): when even that leaves g at the best found, h has nothing better.
    if (M - (gmax - hmin) >= best) continue;
    // Only a GPU with an improving pair is searched for the first one, in the same order.
    if (!any_improving_pair(gshare.data(), hshare.data(), S, M, L, best)) continue;
    const int b = cl.node_of_gpu(h);
    for (int sp = 0; sp < S; ++sp) {
      const int p = g * S + sp;
      const double sx = gshare[sp];
      for (int sq = 0; sq < S; ++sq) {
        const int q = h * S + sq;
        double d = sx - hshare[sq];
        if (d <= 0) continue;
        double worst = std::max(M - d, L + d);
        if (worst >= best) continue;
        const int x = st.phy2log()[p], y = st.phy2log()[q];
        if (!keeps_guarantee(st, f, x, a, b) || !keeps_guarantee(st, f, y, b, a)) continue;
        best = worst;
        out = LayerMove{false, p, q, worst};
      }
    }
  }
  return out;
}

namespace {

void gather(const LayerState& st, int x, std::vector<int>& count, Holders& out) {
  const Cluster& cl = st.cluster();
  LayerState::Scratch& sc = st.scratch();
  if (sc.held.size() != static_cast<size_t>(st.experts())) {
    sc.held.assign(st.experts(), {});
    sc.held_version.assign(st.experts(), 0);
  }
  auto& gpus = sc.held[x];
  if (sc.held_version[x] != st.version(x)) {
    gpus.clear();
    const SlotGpu gpu_of(cl.slots_per_gpu);
    for (int s : st.slots_of(x)) {
      const int k = gpu_of(s);
      if (count[k]++ == 0) gpus.push_back({k, 0});
    }
    for (auto& [k, c] : gpus) c = count[k];
    for (const auto& [k, c] : gpus) count[k] = 0;
    sc.held_version[x] = st.version(x);
  }
  out.gpus = gpus;
}

}  // namespace

namespace {

// The search of best_rewrite: the most loaded GPU g, the best worst-GPU load found so far and its move.
struct RewriteSearch {
  const LayerState& st;
  const Cluster& cl;
  int f, S, E, D, g;
  double best;
  std::optional<LayerMove> out;
  LayerState::Scratch& sc;
  size_t top = 0;

  RewriteSearch(const LayerState& state, int f_)
      : st(state), cl(state.cluster()), f(f_), S(cl.slots_per_gpu), E(state.experts()), D(cl.gpus()),
        g(state.argmax_gpu()), best(0), sc(state.scratch()) {
    const double M = st.load(g);
    best = M - 1e-9 * std::max(1.0, M);
  }

  // Whether a slot of `gpu` before its slot `s` holds `e` too. Two slots of one GPU with the same
  // expert give the same loads when either is rewritten, or rewritten to: the same worst load, which
  // the first one's search has already offered (consider() takes only a strictly lower one), so the
  // second is skipped. A dominant expert has about three replicas on every GPU: the searches for it
  // were most of best_rewrite, made once per slot.
  bool held_before(int gpu, int s, int e) const {
    for (int i = 0; i < s; ++i)
      if (st.phy2log()[gpu * S + i] == e) return true;
    return false;
  }

  void consider(double worst, int slot, int expert) {
    if (worst < best) {
      best = worst;
      out = LayerMove{true, slot, expert, worst};
    }
  }

  // The 16 experts with the largest per-replica share, and their replicas on every GPU (sc.hot_on).
  void find_hot() {
    std::vector<double>& sh = sc.sh;
    std::vector<int>& hot = sc.hot;
    sh.resize(E);
    for (int e = 0; e < E; ++e) sh[e] = st.share(e);
    hot.resize(E);
    std::iota(hot.begin(), hot.end(), 0);
    top = std::min<size_t>(16, hot.size());
    std::partial_sort(hot.begin(), hot.begin() + top, hot.end(),
                      [&](int a, int b) { return sh[a] > sh[b] || (sh[a] == sh[b] && a < b); });
    hot.resize(top);
    // Per-GPU scratch arrays are all zero between calls: only entries that were set are reset.
    if (sc.count.size() < static_cast<size_t>(D)) sc.count.resize(D, 0);
    // The rows of hot_on stay filled between searches while their expert's slots are unchanged (its
    // version): a move changes two experts, so most of the hot experts' rows are still right (filling
    // and clearing all 16 rows at every search was half of best_rewrite at 1,024 nodes). Twice as many
    // rows as hot experts: a free one always exists.
    std::vector<int>& hot_on = sc.hot_on;
    auto& rows = sc.hot_rows;
    const size_t R = 2 * top;
    if (rows.size() < R) {
      rows.resize(R);
      hot_on.resize(R * D, 0);
    }
    sc.hot_row.assign(top, -1);
    sc.row_used.assign(rows.size(), 0);
    for (size_t i = 0; i < top; ++i)
      for (size_t r = 0; r < rows.size(); ++r)
        if (rows[r].expert == hot[i] && rows[r].version == st.version(hot[i])) {
          sc.hot_row[i] = static_cast<int>(r);
          sc.row_used[r] = 1;
          break;
        }
    for (size_t i = 0, r = 0; i < top; ++i) {
      if (sc.hot_row[i] >= 0) continue;
      while (sc.row_used[r]) ++r;
      auto& row = rows[r];
      int* on = hot_on.data() + r * D;
      for (int k : row.gpus) on[k] = 0;
      row.gpus.clear();
      const SlotGpu gpu_of(S);
      for (int s : st.slots_of(hot[i]))
        if (on[gpu_of(s)]++ == 0) row.gpus.push_back(gpu_of(s));
      row.expert = hot[i];
      row.version = st.version(hot[i]);
      sc.hot_row[i] = static_cast<int>(r);
      sc.row_used[r] = 1;
    }
  }

  void slot_of_hottest_gpu_becomes_hot_expert();
  void light_gpu_slot_joins_hottest_gpu_expert();
  // Its steps: the holders of g's slot sp's expert (sc.xh, sc.x_on), gathered on first need; the
  // holders of a light slot's expert y (sc.ycache, once per y and search); their two largest values
  // with g's expert x gaining a replica.
  void gather_x(int sp);
  YHolders& y_holders(int y, double dy);
  const YHolders::Top& tops_of(YHolders& en, int sp, double dx);
  std::vector<char> x_ready;  // [sp]: gather_x(sp) done in this search
  size_t ycached = 0;         // entries of sc.ycache filled in this search

  // Zeroes the per-GPU scratch entries this search set.
  void reset_scratch() {
    for (int sp = 0; sp < S; ++sp)
      for (const auto& [k, c] : sc.xh[sp].gpus) sc.x_on[static_cast<size_t>(sp) * D + k] = 0;
  }
};

void RewriteSearch::slot_of_hottest_gpu_becomes_hot_expert() {
  std::vector<int>& count = sc.count;
  std::vector<int>& hot = sc.hot;
  std::vector<int>& hot_on = sc.hot_on;
  Holders& xs = sc.xs;
  // A slot p on the most loaded GPU g (expert x) becomes expert e: every other holder of x carries
  // dx more per replica, every holder of e de less. The worst GPU afterwards: g itself, or a holder
  // of x other than g. A holder of x that holds no e ends at its load plus its x changes, so only
  // the largest of those counts, and holders of e among the larger ones are evaluated exactly.
  for (int sp = 0; sp < S; ++sp) {
    const int p = g * S + sp, x = st.phy2log()[p];
    if (held_before(g, sp, x)) continue;
    if (st.count(x) <= f || st.distinct_after_remove(x, cl.node_of_slot(p)) < std::min(f, st.distinct(x))) continue;
    const double tx = st.expert_load(x), rx = st.count(x);
    const double dx = tx / (rx - 1) - tx / rx;  // every other holder of x carries this much more
    const Multiples dxs(dx);
    int cx_g = -1;  // x's replicas on g other than p
    for (int s = 0; s < S; ++s) cx_g += st.phy2log()[g * S + s] == x ? 1 : 0;
    // The other holders of x by load, gathered and sorted only when some candidate needs them (most
    // are refused by the bound on g alone).
    bool gathered = false;
    auto gather_x = [&] {
      gather(st, x, count, xs);
      xs.by_value.clear();
      for (size_t i = 0; i < xs.gpus.size(); ++i) {
        const auto [k, c] = xs.gpus[i];
        if (k != g) xs.by_value.push({st.load(k) + dxs(c), static_cast<int>(i)});
      }
      xs.by_value.done();
      gathered = true;
    };
    for (size_t hi = 0; hi < top; ++hi) {
      const int e = hot[hi];
      if (e == x) continue;
      const int* e_on = hot_on.data() + static_cast<size_t>(sc.hot_row[hi]) * D;
      const double te = st.expert_load(e), re = st.count(e);
      const double de = te / re - te / (re + 1);  // every holder of e carries this much less
      double worst = st.load(g) - tx / rx + te / (re + 1);
      worst += sub_times(dxs(cx_g), de, e_on[g]);
      if (worst >= best) continue;  // the holders below only raise it: consider() would refuse it
      if (!gathered) gather_x();
      for (size_t j = 0; const auto* item = xs.by_value.at(j); ++j) {
        const auto [v, i] = *item;
        const auto [k, c] = xs.gpus[i];
        if (e_on[k] == 0) {
          worst = std::max(worst, v);  // the largest holder of x without e; the rest are smaller
          break;
        }
        worst = std::max(worst, st.load(k) + sub_times(dxs(c), de, e_on[k]));
        if (worst >= best) break;  // consider() refuses it already
      }
      consider(worst, p, e);
    }
  }
}

// The holders of g's experts (x_on, xh) and of a light slot's expert (ycache) are gathered only
// when a candidate passes the bound that needs neither; gathers of x count in their own scratch, so
// the counts of y stay intact. The results are those of gathering everything first.
void RewriteSearch::gather_x(int sp) {
  sc.xh[sp].by_value.clear();
  const int x = st.phy2log()[g * S + sp];
  const double tx = st.expert_load(x), rx = st.count(x);
  const double dx = tx / rx - tx / (rx + 1);
  gather(st, x, sc.xcount, sc.xh[sp]);
  for (const auto& [k, c] : sc.xh[sp].gpus) sc.x_on[static_cast<size_t>(sp) * D + k] = c;
  const Multiples minus_dx(dx, true);
  for (size_t i = 0; i < sc.xh[sp].gpus.size(); ++i) {
    const auto [k, c] = sc.xh[sp].gpus[i];
    sc.xh[sp].by_value.push({st.load(k) + minus_dx(c), static_cast<int>(i)});
  }
  sc.xh[sp].by_value.done();
  x_ready[sp] = 1;
}

// Per distinct expert y of the light slots (a search meets few of them, each on several light GPUs:
// 8 in 63 on average at 1,024 nodes), gathered once: its holders, and per slot sp of g the two
// largest loads a holder reaches when the rewrite gives g's expert x one more replica (holders of x
// shed dx per replica of x, holders of y gain dy per replica of y). For a light GPU h the only
// holder that differs is h itself (one replica of y fewer), so the largest over the holders is the
// larger of h's own value and the largest of the others: the same maximum the loop over every
// holder found for each light slot again.
YHolders& RewriteSearch::y_holders(int y, double dy) {
  for (size_t i = 0; i < ycached; ++i)
    if (sc.ycache[i].y == y) return sc.ycache[i];
  if (ycached == sc.ycache.size()) sc.ycache.emplace_back();
  YHolders& en = sc.ycache[ycached++];
  en.y = y;
  en.dy = dy;
  en.dys = Multiples(dy);
  gather(st, y, sc.count, sc.ys);
  en.gpus = sc.ys.gpus;
  en.top.assign(static_cast<size_t>(S), {});
  en.leads = 0;
  for (size_t i = 0; i < en.gpus.size(); ++i) {
    const auto [k, c] = en.gpus[i];
    const std::pair<double, int> item{st.load(k) + en.dys(c), static_cast<int>(i)};
    if (en.leads == 3 && !(item.first > en.lead[2].first)) continue;  // below the three: what the loop below keeps
    int at = en.leads < 3 ? en.leads++ : 3;
    while (at > 0 && item.first > en.lead[at - 1].first) {
      if (at < 3) en.lead[at] = en.lead[at - 1];
      --at;
    }
    if (at < 3) en.lead[at] = item;
  }
  return en;
}

// The two largest over y's holders k of (k without x: its load plus its y changes; with x: also its x changes), for
// g's slot sp (x_on of sp gathered). Only the two values are used, as the largest over the holders other than a
// light GPU h (v1 when k1 is not h, else v2). No x change raises a holder's value (the sums round monotonically),
// so when the three leading holders (YHolders::lead) leave a second value no smaller than the third lead's value
// without x, no other holder can change the two: one pass over y's holders per search instead of one per slot of g.
// Otherwise every holder is evaluated, as before.
const YHolders::Top& RewriteSearch::tops_of(YHolders& en, int sp, double dx) {
  YHolders::Top& t = en.top[static_cast<size_t>(sp)];
  if (t.made) return t;
  const int* on = sc.x_on.data() + static_cast<size_t>(sp) * D;
  const Multiples minus_dx(dx, true);
  auto visit = [&](int k, int c, double v0) {
    const double v = on[k] == 0 ? v0 : st.load(k) + add_times(minus_dx(on[k]), en.dy, c);
    if (t.k1 < 0 || v > t.v1) {
      t.v2 = t.v1, t.k2 = t.k1;
      t.v1 = v, t.k1 = k;
    } else if (t.k2 < 0 || v > t.v2) {
      t.v2 = v, t.k2 = k;
    }
  };
  for (int i = 0; i < en.leads; ++i) {
    const auto [k, c] = en.gpus[static_cast<size_t>(en.lead[i].second)];
    visit(k, c, en.lead[i].first);
  }
  const bool settled = en.gpus.size() <= 3 || (t.k2 >= 0 && t.v2 >= en.lead[2].first);
  if (!settled) {
    t = YHolders::Top{};
    for (const auto& [k, c] : en.gpus) visit(k, c, st.load(k) + en.dys(c));
  }
  t.made = true;
  return t;
}

void RewriteSearch::light_gpu_slot_joins_hottest_gpu_expert() {
  // The other direction: a slot on one of the 16 lightest GPUs (whose expert y keeps its guarantee)
  // becomes another replica of an expert x of the most loaded GPU, so every holder of x sheds load.
  // Holders of x end at load - dx per replica, plus dy per replica of y (other than the rewritten
  // one); the holders of y are evaluated exactly, of the others only the largest counts.
  std::vector<Holders>& xh = sc.xh;
  std::vector<int>& x_on = sc.x_on;
  xh.resize(S);
  if (x_on.size() < static_cast<size_t>(S) * D) x_on.resize(static_cast<size_t>(S) * D, 0);
  if (sc.xcount.size() < static_cast<size_t>(D)) sc.xcount.resize(D, 0);
  x_ready.assign(S, 0);
  for (int sp = 0; sp < S; ++sp) xh[sp].gpus = {};
  st.lightest(16, sc.light_rewrite);
  ycached = 0;
  for (const int h : sc.light_rewrite) {
    if (h == g) continue;
    for (int sq = 0; sq < S; ++sq) {
      const int q = h * S + sq, y = st.phy2log()[q];
      if (held_before(h, sq, y)) continue;
      if (st.count(y) <= f || st.distinct_after_remove(y, cl.node_of_slot(q)) < std::min(f, st.distinct(y))) continue;
      const double ty = st.expert_load(y), ry = st.count(y);
      const double dy = ty / (ry - 1) - ty / ry;
      int cy_h = -1;  // y's replicas on h other than q
      for (int s = 0; s < S; ++s) cy_h += st.phy2log()[h * S + s] == y ? 1 : 0;
      // Replicas of y on GPU k after the rewrite (h loses q).
      auto y_after = [&](int k) {
        int n = k == h ? -1 : 0;
        for (int s = 0; s < S; ++s) n += st.phy2log()[k * S + s] == y ? 1 : 0;
        return n;
      };
      for (int sp = 0; sp < S; ++sp) {
        const int x = st.phy2log()[g * S + sp];
        if (x == y || held_before(g, sp, x)) continue;
        const double tx = st.expert_load(x), rx = st.count(x);
        const double dx = tx / rx - tx / (rx + 1);
        int x_on_h = 0;  // x's replicas on h
        for (int s = 0; s < S; ++s) x_on_h += st.phy2log()[h * S + s] == x ? 1 : 0;
        double worst = st.load(h) - ty / ry + tx / (rx + 1) + add_times(sub_times(0.0, dx, x_on_h), dy, cy_h);
        if (worst >= best) continue;  // the holders below only raise it: consider() would refuse it
        if (!x_ready[sp]) gather_x(sp);
        YHolders& en = y_holders(y, dy);
        const YHolders::Top& t = tops_of(en, sp, dx);
        // h itself, with cy_h replicas of y left, and the largest other holder.
        const int on_h = x_on[static_cast<size_t>(sp) * D + h];
        worst = std::max(worst, st.load(h) + add_times(sub_times(0.0, dx, on_h), dy, cy_h));
        if (t.k1 >= 0 && t.k1 != h) worst = std::max(worst, t.v1);
        else if (t.k2 >= 0) worst = std::max(worst, t.v2);
        if (worst >= best) continue;
        for (size_t j = 0; const auto* item = xh[sp].by_value.at(j); ++j)
          if (y_after(xh[sp].gpus[item->second].first) == 0) {
            worst = std::max(worst, item->first);  // the largest holder of x without another y
            break;
          }
        consider(worst, q, x);
      }
    }
  }
}

}  // namespace

std::optional<LayerMove> best_rewrite(const LayerState& st, int f) {
  RewriteSearch search(st, f);
  search.find_hot();
  search.slot_of_hottest_gpu_becomes_hot_expert();
  search.light_gpu_slot_joins_hottest_gpu_expert();
  search.reset_scratch();
  return search.out;
}

void apply_move(LayerState& st, const LayerMove& m) {
  if (m.rewrite) st.set_slot(m.p, m.q);
  else st.swap_slots(m.p, m.q);
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
      if (bp < 0)
        throw Error("internal: no swap gives expert " + std::to_string(e) + " " + std::to_string(f) + " nodes");
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
  std::stable_sort(keys.begin(), keys.end(),
                   [&](const auto& a, const auto& b) { return groups[a].size() > groups[b].size(); });
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
