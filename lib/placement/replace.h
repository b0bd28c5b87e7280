// Re-placement that counts migration: new loads on the same cluster, starting from the previous
// plan, moving as few expert copies as the balance gain is worth, keeping the fault-tolerance
// guarantee, and a transfer schedule in rounds in which no GPU sends or receives twice.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "placement/cluster.h"
#include "placement/loads.h"

namespace ucpkit::placement {

struct ReplaceOptions {
  int fault_tolerance = 1;
  double expert_bytes = 0;      // bytes of one expert copy (0: copies only)
  double max_moved_bytes = -1;  // budget for the optional (balance) moves; < 0: none
  // A batch of moves is taken only when the imbalance it removes, as a fraction of the plan's total
  // load (decrease of sum of layer maxima / sum of layer means), is at least weight x the fraction of
  // all replicas it copies. 0: every move that lowers a most loaded GPU.
  double migration_weight = 0;
  // Node loss (node_loss.h): `previous` is what survives on the nodes left, so an expert may have no
  // replica there (all of them were on failed nodes); it gets slots like any expert below f and its
  // copies come from a checkpoint (GpuTransfer::from = -1). Otherwise such a plan is refused.
  bool lost_allowed = false;
  // The budget and the weight rule count (node, expert) fetches, a node's experts it did not hold,
  // instead of GPU-level copies (node loss: copies inside a node stay off the network).
  bool count_node_fetches = false;
};

// One expert copy: GPU `to` receives expert `expert` of `layer` from GPU `from` (global GPU ids of
// the cluster; -1: no GPU holds it, it is read from a checkpoint) in round `round`; the sources read the previous
// placement, which stays in memory until the last round (the new weights land in staging buffers and are swapped in
// afterwards).
struct GpuTransfer {
  int layer, expert, from, to, round;
};

struct ReplaceResult {
  std::vector<LayerPlacement> layers;
  std::vector<long long> copies_per_layer;
  long long copies = 0;                      // (GPU, replica) pairs a GPU does not hold yet, summed
  long long mandatory_copies = 0;            // of those, copies the fault-tolerance repair needed
  int layers_from_scratch = 0;               // layers that took balanced-ft's fresh placement (aligned)
  std::vector<LayerPlacement> from_scratch;  // balanced-ft for the new loads as placed (not aligned)
  std::vector<GpuTransfer> transfers;
  int rounds = 0;
  int round_lower_bound = 0;  // most copies one GPU receives (each GPU receives once per round)
};

// Above this many nodes the re-placements take the cheaper paths (1,024 nodes in seconds):
// greedy node pairing in align_to, no from-scratch option for a weighed node loss, and `--previous`
// compares with balanced-ft from scratch only (eplb-global from scratch with --report).
inline constexpr int kLargeClusterNodes = 256;
// Copies GPU-level: for each GPU the replicas of `after` beyond those it holds in `before`.
long long copies_between(const std::vector<int>& before, const std::vector<int>& after, const Cluster& cluster);

// Schedules the copies from `before` to `after` of every layer: each copy from a GPU that holds the
// expert in `before`, greedily in the earliest round where the receiver and some holder are free
// (the holder with the fewest sends so far); a GPU that needs a second copy of an expert only it
// holds copies it locally (from == to, still one send and one receive of that GPU in its round); an
// expert no GPU holds (lost with failed nodes) is read from a checkpoint (from = -1, a receive only).
// Fills transfers, rounds and round_lower_bound. `max_level_words` bounds the words of the per-expert
// rows of holders by send count that find the source (beyond it, and with 0, the same source is found
// by scanning the free holders; tests set it to compare both).
void schedule_transfers(const std::vector<std::vector<int>>& before, ReplaceResult& result, const Cluster& cluster,
                        size_t max_level_words = size_t{1} << 22);

// align_to's node pairing above 256 nodes (exposed for tests): rows to columns of the n x n matrix
// `cost` (row by row, costs clamped to 0..max_cost), cheapest pair first, ties by row then column,
// each row and column once. Returns the column of every row.
std::vector<int> greedy_assignment(const std::vector<int>& cost, int n, int max_cost);

// A lower bound on the GPU-level copies from `before` of `after` with its nodes, and the GPUs inside
// each node, relabeled in any way (what align_to minimizes), from the node cost matrix: the sum of
// its rows' least costs, or of its columns', whichever is larger (exposed for tests; the
// re-placement aligns its from-scratch point only when this bound makes it the best option).
long long alignment_copies_lower_bound(const std::vector<int>& before, const std::vector<int>& after,
                                       const Cluster& cluster, int experts);

// Re-places `previous` (phy2log per layer, all on `cluster`) for `loads`. Mandatory first: experts
// with fewer than f replicas get slots from experts with more, then experts on fewer than f nodes are
// spread by swaps (these copies are made even beyond the budget; the result says how many). Then, per
// layer, the local search of balanced-ft (swaps and rewrites off the most loaded GPU) gives a move
// sequence, and balanced-ft's placement from scratch, nodes and GPUs relabeled for the fewest copies,
// is one more option at its end; batches of moves are taken across layers in order of balance gained per copy while
// they fit the budget and pass the weight rule. Throws Error on shape mismatch.
ReplaceResult replace_with_migration(const std::vector<std::vector<int>>& previous, const LoadMatrix& loads,
                                     const Cluster& cluster, const ReplaceOptions& options);

// The re-placement's counts; "transfers" is the placeholder kTransfersPlaceholder, replaced in the
// plan text by transfers_json_text (plan_json_text's `raw`): a million transfers as JSON objects
// took gigabytes at 1,024 nodes.
nlohmann::json replace_to_json(const ReplaceResult& r, double expert_bytes);
inline constexpr const char* kTransfersPlaceholder = "@transfers";
// The transfers as the JSON array nlohmann would dump ([{"expert","from_gpu","layer","round","to_gpu"}],
// keys sorted); with `node_ids` also "from_node"/"to_node" (physical ids of GPU / gpus_per_node; -1
// for a checkpoint read).
std::string transfers_json_text(const ReplaceResult& r, const std::vector<int>* node_ids = nullptr,
                                int gpus_per_node = 1);
// The same text in pieces of about 1 MB to `sink` (a million transfers are 90 MB of text).
void write_transfers_json(const ReplaceResult& r, const std::vector<int>* node_ids, int gpus_per_node,
                          const std::function<void(std::string_view)>& sink);

}  // namespace ucpkit::placement
