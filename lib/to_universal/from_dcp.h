// ucp-union --input <DCP folder>: a PyTorch Distributed Checkpoint (reshardable or rank-local) into
// ucpkit's universal form, one parameter at a time (docs/formats-dcp.md, "Into the universal form").
// The plan (which DCP fqn becomes which state file of which parameter) is plain data; the run reads
// each parameter's tensors through formats::dcp::Reader, writes zero/<param>/<state>.pt, and commits
// the folder as every other union does (parallel::CollectiveStaging: staging, flush, rename).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/dcp/folder.h"
#include "formats/dcp/metadata.h"
#include "io/dtype.h"
#include "to_universal/convert.h"
#include "to_universal/union_executor.h"

namespace ucpkit::to_universal {

// One parameter of the universal folder.
struct DcpParam {
  std::string name;                            // universal name: the model fqn ("layers.0.attention.wq.weight")
  std::map<std::string, std::string> states;   // universal state ("fp32", "exp_avg", ...) -> DCP fqn
  std::string step;                            // DCP fqn of its optimizer step ("" none)
  std::vector<int64_t> shape;                  // global shape (every state has it)
  DType dtype = DType::Float32;                // of the model tensor
  uint64_t bytes = 0;                          // of its tensors (the split over MPI ranks)
};

// A model tensor without optimizer state (a buffer or counter), carried in its own dtype.
struct DcpBuffer {
  std::string name;                            // the model fqn, as a parameter's
  std::string fqn;                             // its DCP key
  std::vector<int64_t> shape;
  DType dtype = DType::Float32;
  uint64_t bytes = 0;
};

// A bytes entry carried verbatim into the universal form's items/: an LR scheduler's,
// dataloader's or train state's value, torchtitan's flattened param_groups, any other torch.save'd value.
struct DcpItem {
  std::string fqn;                             // its DCP key
  nlohmann::json path;                         // its nested path (formats/dcp/key_record.h recorded_path)
  uint64_t bytes = 0;
};

struct DcpPlan {
  std::vector<DcpParam> params;                // state_dict order of the model tensors
  // optim.param_groups.<i>.<key> bytes entries -> (i, key), in metadata order.
  std::vector<std::pair<std::string, std::pair<size_t, std::string>>> param_groups;
  std::vector<DcpItem> items;                  // the bytes entries neither a step nor a nested param_groups value
  std::vector<std::string> not_carried;        // tensors neither a model tensor nor a parameter's state
  // The model tensors that are no parameters: with optimizer state in the checkpoint, those
  // without any (buffers, counters); in a model-only save, those of a dtype no parameter has (int, bool:
  // a float buffer cannot be told from a parameter there). Not in `params`; each written as it is.
  std::vector<DcpBuffer> buffers;
  bool optimizer = false;                      // optimizer state found
  formats::universal::UniversalSource source;  // manifest.json "source"
};

// The plan of `md` (a folder's metadata, formats::dcp::read_folder_metadata). Throws Error naming
// md.path when an optimizer state names a parameter with no model tensor, or its shape differs.
DcpPlan plan_dcp(const formats::dcp::Metadata& md, const formats::dcp::Folder& folder);

// What ucp-union would write from a DCP-shaped plan (its --dry-run; a torch_dist plan is one too).
UnionCounts dcp_union_counts(const DcpPlan& plan);

// ucp-union for a DCP folder (run_union calls it for formats::detect's kinds dcp and torch_dist); a
// torch_dist input goes to from_torch_dist.h run_union_torch_dist.
RunSummary run_union_dcp(const std::string& input, const std::string& output, const ConvertOptions& options);

}  // namespace ucpkit::to_universal
