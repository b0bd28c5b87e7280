// The placement algorithm interface and the registry the planners are found in by name.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "placement/cluster.h"
#include "placement/loads.h"
#include "placement/recovery.h"

namespace ucpkit::placement {

struct PlacementOptions {
  int fault_tolerance = 1;   // f: every expert keeps a replica when fewer than f nodes fail
  int groups = 1;            // expert groups (EPLB's group-limited routing); hierarchical when groups % nodes == 0
  int overlap_degree = -1;   // Hecate's t (-1: number of experts)
  int memory = -1;           // Hecate's m: distinct experts materialized per GPU per layer (-1: slots per GPU)
  RecoveryOptions recovery;  // used by planners that compare candidate placements
  // balanced-ft: 0 = most balanced, 1 = most recoverable when f nodes fail (recovery_weight.h)
  double recovery_weight = 0;
  // balanced-ft: per layer the most recoverable candidate (p(f)) whose most loaded GPU is no heavier
  // than the default's, so the plan is at least as balanced and at least as recoverable at k = f
  // (the --pareto point "free"; recovery_weight.h, recovery_free_layer). Excludes recovery_weight > 0.
  bool recovery_free = false;
};

struct PlacementResult {
  std::vector<LayerPlacement> layers;
  nlohmann::json details = nlohmann::json::object();  // algorithm-specific keys added to the plan
};

// One placement algorithm: all layers at once (Hecate shards across layers).
class PlacementAlgorithm {
 public:
  virtual ~PlacementAlgorithm() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;
  virtual PlacementResult place(const LoadMatrix& loads, const Cluster& cluster,
                                const PlacementOptions& options) const = 0;
};

using AlgorithmFactory = std::function<std::unique_ptr<PlacementAlgorithm>()>;

// Registers a factory under `name`; each algorithm file registers itself with a static Registrar.
void register_algorithm(const std::string& name, AlgorithmFactory factory);
// Throws UsageError listing the known names when `name` is unknown.
std::unique_ptr<PlacementAlgorithm> make_algorithm(const std::string& name);
std::vector<std::string> algorithm_names();

struct AlgorithmRegistrar {
  AlgorithmRegistrar(const std::string& name, AlgorithmFactory factory) {
    register_algorithm(name, std::move(factory));
  }
};

// Common checks: slots for every expert, a placement of the right size with every expert present.
void check_fits(const LoadMatrix& loads, const Cluster& cluster);
void check_placement(const LayerPlacement& layer, const Cluster& cluster, int experts, const std::string& algorithm);

}  // namespace ucpkit::placement
