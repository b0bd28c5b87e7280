// One layer's placement as mutable state for local search: replica counts, GPU loads under the
// equal-share assumption, and per expert the replicas on every node, kept current by slot swaps and
// slot rewrites. Shared by balanced-ft (placement) and the migration-aware re-placement.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "placement/cluster.h"

namespace ucpkit::placement {

class LayerState {
 public:
  LayerState(const Cluster& cluster, std::vector<double> loads, std::vector<int> phy2log);

  const Cluster& cluster() const { return cluster_; }
  int experts() const { return experts_; }
  const std::vector<int>& phy2log() const { return phy2log_; }
  const std::vector<double>& gpu_loads() const { return load_; }
  double load(int gpu) const { return load_[gpu]; }
  double expert_load(int e) const { return t_[e]; }
  int count(int e) const { return cnt_[e]; }
  int distinct(int e) const { return distinct_[e]; }
  int on_node(int e, int node) const { return nodecnt_[static_cast<size_t>(e) * cluster_.nodes + node]; }
  // Load one replica of e carries: t_e / r_e.
  double share(int e) const { return share_[e]; }
  const std::vector<int>& slots_of(int e) const { return slots_of_[e]; }
  // A stamp unique to the current slots_of(e) across all states (new on every swap or rewrite
  // involving e; copies share it): caches of per-expert data.
  unsigned long long version(int e) const { return version_[e]; }
  // The most loaded GPU (ties: the largest id) and its load.
  double max_load() const { return load_[top_]; }
  int argmax_gpu() const { return top_; }
  // The k lightest GPUs, by (load, GPU) ascending (ties by id), into `out` (fewer when there are fewer).
  void lightest(size_t k, std::vector<int>& out) const;
  // The GPUs by (load, GPU) ascending, one at a time: next() is -1 after the last. The lightest 64
  // come straight from a sorted list; past them (no search goes that far) the others are sorted once.
  class Lightest {
   public:
    explicit Lightest(const LayerState& state);
    int next();

   private:
    const LayerState& st_;
    size_t taken_ = 0;       // of st_.bottom_, then of rest_
    std::vector<int> rest_;  // past the lightest: the others by (load, GPU), sorted on first use
  };

  // Distinct nodes of x after one of its replicas moves from node a to node b.
  int distinct_after_move(int x, int a, int b) const;
  // Distinct nodes of x after one of its replicas on node a is removed (rewritten).
  int distinct_after_remove(int x, int a) const { return distinct_[x] - (on_node(x, a) == 1 ? 1 : 0); }

  // Scratch arrays of the move searches, kept with the state between calls (a copy starts empty).
  struct Scratch;
  Scratch& scratch() const;

  // Exchanges the experts of two slots (replica counts and shares unchanged).
  void swap_slots(int p, int q);
  // Rewrites slot p to expert e: the old expert loses a replica, e gains one, and every GPU holding
  // either has its load updated.
  void set_slot(int p, int e);

 private:
  void add_node(int e, int node, int delta);
  void add_load(int gpu, double delta);
  void reorder_moved();
  // The GPUs by (load, id): the kBottom lightest as a sorted list (what the searches walk), the
  // others as a min-heap, with each GPU's place, and the most loaded per block of kBlock GPUs and of
  // all. The min-heap is lazy: an entry keeps the load it was last placed with, a bound on the GPU's
  // load (at most it), and only a change below that bound moves it (up: a short way). A stale entry
  // is put right when it reaches the top (settle_rest): the top is then the GPU of the smallest
  // (load, id) exactly, as every other entry bounds its GPU. The most loaded GPU is exact after every
  // change: a rewrite of an expert with thousands of replicas changes the loads of most GPUs, and
  // scanning their blocks again is one pass over the loads where a max-heap moved each of them (or
  // was made again) and then put its stale entries right one at a time.
  static constexpr size_t kBottom = 64;
  static constexpr int kBlock = 64;
  struct Entry {
    double key;  // the GPU's load when the entry was last set
    int gpu;
  };
  bool lighter(int a, int b) const { return load_[a] < load_[b] || (load_[a] == load_[b] && a < b); }
  static bool lighter(const Entry& a, const Entry& b) { return a.key < b.key || (a.key == b.key && a.gpu < b.gpu); }
  Entry entry(int gpu) const { return {load_[gpu], gpu}; }
  void place(int gpu);  // restores the order after gpu's load changed (the only change since it held)
  bool heavier(int a, int b) const { return load_[a] > load_[b] || (load_[a] == load_[b] && a > b); }
  void scan_block(size_t b);  // block_top_[b] from its GPUs' loads
  void scan_top();            // top_ from block_top_
  void settle_rest();         // the min-heap's top entry current
  void build_order();         // the order from scratch
  void insert_bottom(int gpu);
  // Moves the min-heap's heap[i] up (when `up`) and down to its place.
  void sift(std::vector<Entry>& heap, std::vector<int>& at, size_t i, bool up);
  Cluster cluster_;
  int experts_;
  std::vector<double> t_;
  std::vector<int> phy2log_, cnt_, distinct_, nodecnt_;
  std::vector<double> load_;
  std::vector<double> share_;      // t_e / r_e (0 without replicas), kept with the counts
  std::vector<int> bottom_;        // the kBottom lightest GPUs (all, when fewer), sorted
  std::vector<Entry> rest_;        // min-heap of the other GPUs
  std::vector<int> rest_at_;       // per GPU: its index in rest_ (-1: in bottom_)
  std::vector<int> block_top_;     // per block of kBlock GPUs: its most loaded GPU (ties: the largest id)
  int top_ = 0;                    // the most loaded GPU (ties: the largest id)
  std::vector<char> block_moved_;  // reorder_moved: blocks with a GPU whose load changed
  std::vector<std::vector<int>> slots_of_;
  std::vector<int> pos_;  // per slot: its index in slots_of_ of its expert
  std::vector<unsigned long long> version_;
  std::vector<int> moved_;  // GPUs whose load changed, while set_slot updates many at once
  std::vector<char> moved_mark_;
  std::vector<double> pending_;                 // their loads after the change, set in reorder_moved
  std::vector<int> moved_blocks_, moved_down_;  // reorder_moved: blocks to scan; GPUs past their min-heap bound
  struct ScratchSlot {
    std::unique_ptr<Scratch> p;
    ScratchSlot();
    ScratchSlot(const ScratchSlot&);
    ScratchSlot(ScratchSlot&&) noexcept;
    ScratchSlot& operator=(const ScratchSlot&);
    ScratchSlot& operator=(ScratchSlot&&) noexcept;
    ~ScratchSlot();
  };
  mutable ScratchSlot scratch_;
};

// One local-search move that lowers the most loaded GPU: a swap of two slots (replica counts
// unchanged) or a rewrite of one slot to another expert (the old expert loses a replica, the new one
// gains one, so every GPU holding either changes load). `worst` is the largest load among the GPUs it
// touches afterwards; a move is only offered when that is below the current maximum.
struct LayerMove {
  bool rewrite = false;
  int p = -1, q = -1;  // swap: slots p and q; rewrite: slot p becomes expert q
  double worst = 0;
};

// Best swap of a replica on the most loaded GPU with a lighter replica on one of the lightest GPUs
// (all GPUs up to 64, else the 64 lightest), every expert keeping at least min(f, its current
// distinct nodes) distinct nodes.
std::optional<LayerMove> best_swap(const LayerState& state, int f);
// Best rewrite: a slot on the most loaded GPU (whose expert keeps at least f replicas and
// min(f, distinct) nodes) becomes one of the 16 experts with the largest load per replica, or a slot
// on one of the 16 lightest GPUs (same condition) becomes another replica of an expert of the most
// loaded GPU.
std::optional<LayerMove> best_rewrite(const LayerState& state, int f);
void apply_move(LayerState& state, const LayerMove& move);

// Applies best_swap, or best_rewrite when no swap helps (rewrites only with `rewrites`), until neither
// helps or `max_moves` is reached. Returns the number of moves.
int reduce_max(LayerState& state, int f, int max_moves, bool rewrites);

// Raises every expert with fewer than min(f, replicas) distinct nodes to that many by swapping a
// duplicate replica with a slot on a node lacking the expert (the partner keeps its own guarantee),
// choosing the swap with the smallest resulting GPU load. Returns the swaps made. Throws Error when
// no such swap exists.
std::vector<std::pair<int, int>> repair_fault_tolerance(LayerState& state, int f);

// Recovery for k >= f failed nodes: an expert on exactly f nodes is lost exactly when its node set
// fails, so p(f) = 1 - (distinct node sets of such experts) / C(N, f). Merges those node sets: the
// experts of a small set move, one replica per node, onto the nodes of a larger set by swaps with
// replicas of experts that stay on more than f nodes, never raising a GPU above `max_load`; a set is
// merged entirely or not at all. Returns {node sets before, node sets after}.
std::pair<int, int> overlap_node_sets(LayerState& state, int f, double max_load);

}  // namespace ucpkit::placement
