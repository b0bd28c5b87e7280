// Cluster sizes and fault tolerance: given, or taken from the plan re-placed.
#include "placement/cluster_request.h"

#include <vector>

#include "core/error.h"

namespace ucpkit::placement {
namespace {

struct Size {
  const char* option;  // --nodes
  const char* key;     // nodes (plan JSON)
  const char* unit;    // "nodes"
  const std::optional<int>& given;
  int Cluster::*field;
};

// What the base plan's option means, for the message refusing a size that disagrees with it.
std::string base_hint(const BasePlan& base) {
  if (base.option == "--previous")
    return "--previous re-places on the previous plan's cluster (leave the sizes out to take them from it); after "
           "node loss use --current " +
           base.path + " --failed-nodes i,j, for new nodes --current " + base.path + " --added-nodes k";
  return "the sizes describe the current plan (leave them out to take them from it); lost nodes are --failed-nodes "
         "i,j, new ones --added-nodes k";
}

int fault_tolerance_given(const ClusterRequest& r) {
  if (r.survive_node_failures && *r.survive_node_failures < 0)
    throw UsageError("--survive-node-failures must be at least 0 (0: every expert on at least one node)");
  if (r.fault_tolerance && *r.fault_tolerance < 1)
    throw UsageError("--fault-tolerance must be at least 1 (--fault-tolerance F is --survive-node-failures F-1)");
  if (r.survive_node_failures && r.fault_tolerance && *r.survive_node_failures + 1 != *r.fault_tolerance)
    throw UsageError("--survive-node-failures " + std::to_string(*r.survive_node_failures) + " and --fault-tolerance " +
                     std::to_string(*r.fault_tolerance) +
                     " disagree (--fault-tolerance F is --survive-node-failures F-1); give one of them");
  if (r.survive_node_failures) return *r.survive_node_failures + 1;
  return r.fault_tolerance ? *r.fault_tolerance : 0;
}

}  // namespace

std::string fault_tolerance_option(int f) {
  return "--survive-node-failures " + std::to_string(f - 1) + " (--fault-tolerance " + std::to_string(f) + ")";
}

std::string survives_text(int f) {
  return "survives " + std::to_string(f - 1) + " node failure" + (f - 1 == 1 ? "" : "s");
}

ResolvedCluster resolve_cluster(const ClusterRequest& request, const BasePlan& base) {
  ResolvedCluster out;
  const int f = fault_tolerance_given(request);
  const Size sizes[] = {
      {"--nodes", "nodes", "nodes", request.nodes, &Cluster::nodes},
      {"--gpus-per-node", "gpus_per_node", "GPUs per node", request.gpus_per_node, &Cluster::gpus_per_node},
      {"--slots-per-gpu", "slots_per_gpu", "slots per GPU", request.slots_per_gpu, &Cluster::slots_per_gpu}};
  std::vector<std::string> disagree, taken;
  for (const Size& s : sizes) {
    if (!base.plan) {
      if (!s.given)
        throw UsageError(std::string(s.option) +
                         " is required (or --current <plan.json>, whose sizes are the default)");
      out.cluster.*s.field = *s.given;
      continue;
    }
    const int planned = base.plan->cluster.*s.field;
    if (s.given && *s.given != planned)
      disagree.push_back(std::string(s.option) + " " + std::to_string(*s.given) + " disagrees with " + base.option +
                         " " + base.path + ", which has " + std::to_string(planned) + " " + s.unit);
    if (!s.given) {
      out.from_plan[s.key] = planned;
      taken.push_back(std::string(s.option) + " " + std::to_string(planned));
    }
    out.cluster.*s.field = planned;
  }
  if (!disagree.empty()) {
    std::string line;
    for (const auto& d : disagree) line += (line.empty() ? "" : "; ") + d;
    throw UsageError(line + ": " + base_hint(base));
  }
  validate_cluster(out.cluster);
  out.fault_tolerance = f > 0 ? f : 1;
  if (f == 0 && base.plan) {
    out.fault_tolerance = base.plan->fault_tolerance;
    out.from_plan["survives_node_failures"] = out.fault_tolerance - 1;
    taken.push_back("--survive-node-failures " + std::to_string(out.fault_tolerance - 1));
  }
  if (!taken.empty()) {
    out.said = "from " + base.option + " " + base.path + ":";
    for (size_t i = 0; i < taken.size(); ++i) out.said += (i ? ", " : " ") + taken[i];
  }
  return out;
}

}  // namespace ucpkit::placement
