// Fragment mapping, the I/O-free core of the extract plan: from what one optimizer shard says about
// its flat partitions (param_slice_mappings under ZeRO-1/2 and BF16_Optimizer, param_shapes
// sub-groups under ZeRO-3) to the plan's per-parameter fragments in join order, and the checks that
// every TP slice is covered exactly. The planners (ucp/extract.cpp, ucp/extract_zero3.cpp) read the
// pickles and feed these steps plain data.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "io/shape.h"
#include "formats/deepspeed/autoep.h"
#include "patterns/pattern_set.h"
#include "to_universal/plan.h"
#include "to_universal/shard_reader.h"

namespace ucpkit::to_universal {

using ShapeMap = std::map<std::string, std::vector<int64_t>>;
using SliceMappings = std::vector<std::tuple<std::string, int64_t, int64_t>>;  // (name, start, numel)

// ---- ZeRO-1/2 and BF16_Optimizer -------------------------------------------------------------

// Where one param group's flat partition stands among its buffer's partitions: partition `part` of
// `count`. Expert groups are partitioned over the expert-DP group of EP rank `ep_rank`
// (formats::deepspeed::ep_coords); dense groups over all `dp` ranks (ep_rank -1).
struct GroupPartition {
  int part = 0, count = 1, ep_rank = -1;
};
// Throws Error naming `path` when an expert group has no ep_size or the recorded partition_count
// differs from the one the layout gives.
GroupPartition group_partition(const GroupInfo& group, int g, int dp_rank, int dp, bool data_before_expert,
                               const std::string& path);

// The expert facts the mapping of expert groups needs, read from the model and expert files.
struct ExpertFacts {
  std::vector<int> num_experts;                        // native MoE: experts per MoE layer
  std::map<std::string, int> moe_layer_of;             // native expert parameter (expert index 0) -> MoE layer
  std::map<int, int> layer_number;                     // MoE layer -> the manifest's expert layer
                                                       // (formats::deepspeed::expert_layer_numbers)
  std::map<std::string, std::string> expert_file_of;   // global expert parameter name -> its expert file
  std::vector<formats::deepspeed::AutoEpLayer> autoep;             // AutoEP layers (ds_autoep_layers)
  std::map<std::string, size_t> autoep_param;          // "<prefix>.w1" -> index into `autoep`
};

// One param group of one optimizer shard, as plain data.
struct ShardGroup {
  int file = -1, group = -1;   // index into ExtractPlan::files; param group
  int pp_rank = 0, tp_rank = 0;
  GroupInfo info;
  GroupPartition partition;
  SliceMappings fragments;     // param_slice_mappings[group], buffer order
  std::vector<std::string> states;
  bool has_step = false;
};

// Collects the fragments of every ZeRO-1/2 shard group into the plan's parameters, in the order
// first seen. Parameters are named by the universal name (native MoE experts renumbered to global
// ids); AutoEP fused weights collect the fragments of every EP rank in part order r * (DP/EP) + edp.
class Zero12FragmentMap {
 public:
  Zero12FragmentMap(int tp, int pp, const patterns::PatternSet& patterns, const ExpertFacts& experts);
  // Adds `group`'s fragments to `plan`. `shapes`: the TP-local shapes of the group's model-parallel
  // rank; `model_file`: its model states (named in errors); `path`: the shard (named in errors).
  void add(ExtractPlan& plan, const ShardGroup& group, const ShapeMap& shapes, const std::string& model_file,
           const std::string& path);
  // The pattern sources that matched none of the parameters seen, in the set's order.
  std::vector<std::string> unused_patterns() const;

 private:
  struct Target {  // a fragment's parameter
    std::string name;
    int part = 0, moe_layer = -1, expert = -1;
    const formats::deepspeed::AutoEpLayer* autoep = nullptr;
  };
  Target target_of(const std::string& local, const ShardGroup& group, const std::string& path) const;
  const patterns::ParamRule& rule_of(const std::string& name);
  int tp_, pp_;
  const patterns::PatternSet& patterns_;
  const ExpertFacts& experts_;
  std::map<std::string, size_t> index_;
  std::map<std::string, patterns::ParamRule> rules_;
};

// Every TP slice of every parameter covered by its fragments: sorted by part, no part twice, as many
// elements as its shape. Throws Error naming the shard (or `dir`) otherwise.
void check_zero12_coverage(ExtractPlan& plan, int tp, const std::string& dir);

// ---- ZeRO-3 -----------------------------------------------------------------------------------

// param_shapes of one TP rank: per sub-group, (name, TP-local shape) in flat-buffer order.
using SubGroups = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;

// The plan's parameters in TP rank 0's param_shapes order (AutoEP fused weights marked with their
// layer's E and MoE layer id), with every TP rank's shapes (AutoEP: [E_local, ...] -> [E, ...]).
// Returns name -> index into plan.params. Throws Error naming model_files[t] when the ranks list
// different parameters, a name twice, or an AutoEP weight with a wrong or missing shape.
std::map<std::string, size_t> zero3_params(ExtractPlan& plan, const std::vector<SubGroups>& sub_groups,
                                           const std::vector<formats::deepspeed::AutoEpLayer>& autoep,
                                           const std::map<std::string, size_t>& autoep_param,
                                           const std::vector<std::string>& model_files);

// One ZeRO-3 sub-group of one shard, as plain data.
struct Zero3SubGroup {
  int file = -1, group = -1, tp_rank = 0, dp_rank = 0;
  int partition_count = 1, partition_rank = 0;  // over all DP ranks, or the expert-DP group
  bool autoep_expert = false;
  std::vector<std::string> states;
  bool has_step = false;
};

// Adds the slices of `sub` to the plan: every parameter of the sub-group split on its own into
// ceil(numel/count) slices, this rank holding slice partition_rank (padding at the end); AutoEP expert
// slices go to part ep_rank * count + rank. `params`: the sub-group's parameters (param_shapes);
// `rank_autoep`: ds_autoep_layers of this DP rank's model file `model_file`. The first shard
// (tp 0, dp 0) sets each parameter's states and step. Throws Error naming `path` on any mismatch.
// Returns the elements the sub-group's slices take in the flat partition (padding included).
int64_t add_zero3_subgroup(ExtractPlan& plan, const std::map<std::string, size_t>& index, const Zero3SubGroup& sub,
                        const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                        const std::vector<formats::deepspeed::AutoEpLayer>& rank_autoep,
                        const std::map<std::string, size_t>& autoep_param, int dp, const std::string& model_file,
                        const std::string& path);

// As check_zero12_coverage, with the ZeRO-3 messages (two ranks claiming one part; slices short).
void check_zero3_coverage(ExtractPlan& plan, int tp, const std::string& dir);

}  // namespace ucpkit::to_universal
